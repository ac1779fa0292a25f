// bench/bullmq/noop_processor.js -- the sandboxed processor of life.js:
// BullMQ runs this file in child processes; a no-op, like bench/noop.lua.
module.exports = async function () {};

-- moonjob.json -- the name processors and programs require the exact JSON
-- codec by; it lives in moonjob.codec.json, beside the other modules loaded
-- on both sides of the channel.
return require "moonjob.codec.json"

-- The command line's help and its usage errors: each command's own --help,
-- "did you mean" for a mistyped command or option, and the "Try 'moonjob
-- --help'" hint only after a wrong command line (not after a processor that
-- cannot load).
local h = require "helpers"
local cli = require "cli"
local help = require "moonjob.cli.help"
local args = require "moonjob.cli.args"

local MOONJOB = cli.MOONJOB
local HINT = "Try 'moonjob --help'."

describe("moonjob's help", function()
  it("moonjob COMMAND --help shows that command's synopsis and options, not run's", function()
    local out, err, status = h.sh(MOONJOB .. "worker --help")
    assert.equal(0, status, err)
    out = out:match("^(.-)\nexit status") -- (which names --halt)
    assert.matches("^usage: moonjob worker PROCESSOR", out)
    for _, flag in ipairs({ "--lease", "--grace", "--prefetch", "--keep-logs", "--metrics" }) do
      assert.truthy(out:find(flag, 1, true), flag)
    end
    for _, flag in ipairs({ "--halt", "--joblog", "--resume", "--rate", "--dedupe" }) do
      assert.falsy(out:find(flag, 1, true), flag .. " is not the worker's")
    end
    assert.equal(out, (h.sh(MOONJOB .. "help worker")):match("^(.-)\nexit status"))
    out = h.sh(MOONJOB .. "add --help")
    assert.matches("^usage: moonjob add ", out)
    assert.truthy(out:find("--dedupe", 1, true))
    assert.truthy(out:find("--group NAME", 1, true))
    assert.falsy(out:find("--lease", 1, true))
  end)

  it("moonjob --help lists every command with its summary", function()
    local out, err, status = h.sh(MOONJOB .. "--help")
    assert.equal(0, status, err)
    assert.matches("^usage: moonjob run PROCESSOR %[INPUT%]", out)
    for _, name in ipairs(help.names()) do
      assert.matches("\n  " .. name:gsub("%-", "%%-") .. " +%S", out)
    end
  end)

  it("each command's --help names each option it lists, and the parser takes each of them", function()
    local known = {}
    for _, name in ipairs(args.option_names()) do known[name] = true end
    for _, c in ipairs(help.COMMANDS) do
      local out, err, status = h.sh(MOONJOB .. c.name .. " --help")
      assert.equal(0, status, err)
      assert.matches("^usage: moonjob " .. c.name, out)
      for _, flag in ipairs(c.options) do
        assert.is_true(known[flag], flag .. " (of " .. c.name .. ") is not an option the parser takes")
        assert.truthy(out:find(flag, 1, true), flag .. " missing from moonjob " .. c.name .. " --help")
      end
    end
  end)

  it("the reference's synopsis names each option a command's help lists", function()
    local doc = assert(cli.read("docs/reference/cli.md"))
    local synopsis = doc:match("## SYNOPSIS\n\n```\n(.-)```")
    for _, c in ipairs(help.COMMANDS) do
      -- the command's synopsis lines: each begins "moonjob NAME", its indented lines follow
      local part, mine = {}, false
      for line in synopsis:gmatch("[^\n]+") do
        if line:find("^moonjob ") then mine = line:match("^moonjob (%S+)") == c.name end
        if mine then part[#part + 1] = line end
      end
      local text = table.concat(part, " ")
      assert.truthy(#text > 0, "no synopsis for " .. c.name)
      for _, flag in ipairs(c.options) do
        if flag ~= "-h" then assert.truthy(text:find(flag, 1, true), flag .. " missing from the synopsis of " .. c.name) end
      end
    end
  end)

  it("--redis names every form of URL, in the help's short lines and in the reference", function()
    local out = h.sh(MOONJOB .. "worker --help")
    local entry = out:match("\n  %-%-redis URL(.-)\n  %-%-")
    assert.truthy(entry, out)
    local doc = assert(cli.read("docs/reference/cli.md")):match("\n%*%*%-%-redis%*%* %*URL%*\n(.-)\n\n")
    assert.truthy(doc)
    for _, form in ipairs({ "redis://", "rediss://", "redis+sentinel://", "redis+cluster://", "rediss+sentinel://",
      "rediss+cluster://", "MOONJOB_REDIS_CA", "MOONJOB_REDIS" }) do
      assert.truthy(entry:find(form, 1, true), form .. " missing from the help's --redis")
      assert.truthy(doc:find(form, 1, true), form .. " missing from the reference's --redis")
    end
    for line in out:gmatch("[^\n]+") do assert.truthy(#line <= 80, line) end
  end)
end)

describe("moonjob's usage errors", function()
  it("suggest the command a mistyped one most likely means, exit 2", function()
    local out, err, status = h.sh(MOONJOB .. "wrker spec/fixtures/echo.lua")
    assert.equal(2, status)
    assert.equal("", out)
    assert.matches("^moonjob: unknown command 'wrker' %(did you mean 'worker'%?%)", err)
    _, err, status = h.sh(MOONJOB .. "schedul list --queue q")
    assert.equal(2, status)
    assert.matches("did you mean 'schedule'%?", err)
    _, err, status = h.sh(MOONJOB .. "frobnicate")
    assert.equal(2, status)
    assert.falsy(err:find("did you mean", 1, true), err)
  end)

  it("suggest a command by edit distance or by the word it begins, and none when two are as near", function()
    local names = { "run", "worker", "workers", "add", "status", "jobs", "job", "limit", "limits", "remove", "resume" }
    for word, want in pairs({ wrker = "worker", work = "worker", wokers = "workers", limt = "limit", sta = "status",
      jbos = "jobs", rem = "remove", res = "resume" }) do
      assert.equal(want, help.suggest(word, names), word)
    end
    for _, word in ipairs({ "re", "j", "frobnicate", "help" }) do assert.is_nil(help.suggest(word, names), word) end
  end)

  it("suggest the option a mistyped long option most likely means, exit 2", function()
    local _, err, status = h.sh(MOONJOB .. "jobs --queu q")
    assert.equal(2, status)
    assert.equal("moonjob: unknown option '--queu' (did you mean '--queue'?)\n" .. HINT .. "\n", err)
    _, err, status = h.sh(MOONJOB .. "run --keep-ordr examples/square.lua")
    assert.equal(2, status)
    assert.matches("did you mean '%-%-keep%-order'%?", err)
  end)

  it("say a processor that cannot load without the usage hint", function()
    local broken = h.write_file(os.tmpname(), "return function(\n")
    for _, processor in ipairs({ "spec/fixtures/no_such_processor.lua", broken }) do
      local out, err, status = h.sh(MOONJOB .. "run " .. processor, "1\n")
      assert.equal(2, status)
      assert.equal("", out)
      assert.matches("^moonjob: ELOAD: ", err)
      assert.falsy(err:find(HINT, 1, true), err)
      assert.equal(1, select(2, err:gsub("\n", "")), err)
    end
    os.remove(broken)
  end)
end)

-- wrk script: consumers that receive in batches and ack every message.
-- Each wrk thread keeps the lease tokens its batches returned; a
-- connection acks the next token, or asks for a new batch (up to 100,
-- long-polling 1 s) when none is left. Prints one RESULT line with the
-- messages received and acked (204) per second.
local queue = os.getenv("QUEUE") or "bench"
local batch = os.getenv("BATCH") or "100"
local threads = {}

setup = function(thread)
  table.insert(threads, thread)
end

init = function(args)
  tokens = {}
  received = 0
  acked = 0
  failed = 0
end

request = function()
  local token = table.remove(tokens)
  if token then
    return wrk.format("POST", "/v1/queues/" .. queue .. "/leases/" .. token .. "/ack")
  end
  return wrk.format("POST", "/v1/queues/" .. queue .. "/receive-batch?max=" .. batch .. "&wait=1")
end

response = function(status, headers, body)
  if status == 204 then
    acked = acked + 1
  elseif status == 200 then
    for token in string.gmatch(body, '"leaseToken":"([^"]+)"') do
      received = received + 1
      tokens[#tokens + 1] = token
    end
  else
    failed = failed + 1
  end
end

done = function(summary, latency, requests)
  local r, a, f = 0, 0, 0
  for _, thread in ipairs(threads) do
    r = r + thread:get("received")
    a = a + thread:get("acked")
    f = f + thread:get("failed")
  end
  local seconds = summary.duration / 1e6
  io.write(string.format(
    "RESULT pull_received=%d pull_acked=%d pull_failed=%d pull_seconds=%.2f pull_msgs_per_s=%.0f\n",
    r, a, f, seconds, a / seconds))
end

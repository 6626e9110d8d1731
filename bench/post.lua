-- wrk script: POST a body of BODY_BYTES (default 1024) bytes (or, with
-- METHOD=GET, a bare GET), with API_KEY as its bearer key if set; prints
-- one machine-readable RESULT line.
wrk.method = os.getenv("METHOD") or "POST"
if os.getenv("API_KEY") then
  wrk.headers["Authorization"] = "Bearer " .. os.getenv("API_KEY")
end
if wrk.method == "POST" then
  wrk.body = string.rep("x", tonumber(os.getenv("BODY_BYTES") or "1024"))
  wrk.headers["Content-Type"] = "application/octet-stream"
end

done = function(summary, latency, requests)
  local seconds = summary.duration / 1e6
  io.write(string.format(
    "RESULT sends_per_s=%.0f p50_us=%d p99_us=%d requests=%d non_2xx=%d socket_errors=%d\n",
    summary.requests / seconds,
    latency:percentile(50), latency:percentile(99),
    summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end

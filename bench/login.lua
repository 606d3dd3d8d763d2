-- wrk script: POST /v1/apple/login with one pre-minted identity token per request.
--   TOKENS=file API_KEY=abk_… wrk -t1 -c32 -d15s --latency -s bench/login.lua http://127.0.0.1:PORT
local tokens = {}
local index = 0
local api_key = os.getenv("API_KEY")

function init(args)
  for line in io.lines(os.getenv("TOKENS")) do
    if #line > 0 then tokens[#tokens + 1] = line end
  end
  index = math.random(#tokens)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. api_key
end

function request()
  index = index % #tokens + 1
  return wrk.format(nil, "/v1/apple/login", nil, '{"identity_token":"' .. tokens[index] .. '"}')
end

function done(summary, latency, requests)
  io.write(string.format("non2xx=%d\n", summary.errors.status))
  io.write(string.format("latency_p50_us=%d latency_p99_us=%d\n", latency:percentile(50), latency:percentile(99)))
end

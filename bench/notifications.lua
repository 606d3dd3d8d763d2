-- wrk script: POST one pre-signed notification body per request (each a distinct jti).
--   BODIES=file wrk -t1 -c32 -d15s --latency -s bench/notifications.lua http://127.0.0.1:PORT
local bodies = {}
local index = 0

function init(args)
  for line in io.lines(os.getenv("BODIES")) do
    if #line > 0 then bodies[#bodies + 1] = line end
  end
  index = math.random(#bodies)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  index = index % #bodies + 1
  return wrk.format(nil, "/v1/apple/notifications", nil, bodies[index])
end

function done(summary, latency, requests)
  io.write(string.format("non2xx=%d\n", summary.errors.status))
end

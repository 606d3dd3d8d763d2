-- wrk script: POST each pre-signed notification body of $BODIES once, in order (each a
-- distinct jti: a second post of one is a duplicate, a different and cheaper request). When
-- every body has been answered the thread stops and touches $DONE_FILE (the caller then ends
-- wrk with SIGINT, so wrk's figures cover the time the bodies took); the few connections that
-- ask for a request after the last body get GET /healthz.
--   BODIES=file DONE_FILE=file wrk -t1 -c32 -d30s --latency -s bench/notifications.lua http://127.0.0.1:PORT
local bodies = {}
local index = 0
local answered = 0

function init(args)
  for line in io.lines(os.getenv("BODIES")) do
    if #line > 0 then bodies[#bodies + 1] = line end
  end
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  index = index + 1
  if index > #bodies then
    return wrk.format("GET", "/healthz", nil, nil)
  end
  return wrk.format("POST", "/v1/apple/notifications", nil, bodies[index])
end

function response(status, headers, body)
  answered = answered + 1
  if answered == #bodies then
    local done_file = os.getenv("DONE_FILE")
    if done_file then io.open(done_file, "w"):close() end
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  io.write(string.format("non2xx=%d\n", summary.errors.status))
end

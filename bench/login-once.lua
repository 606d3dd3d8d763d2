-- wrk script: POST /v1/apple/login once per line of $TOKENS, in order, and never twice (first
-- logins, code exchanges: a second use would be another kind of request). A line is a token,
-- or a token and the authorization code issued with it. When every line has been answered
-- the thread stops and touches $DONE_FILE (the caller then ends wrk with SIGINT, so wrk's
-- figures cover the time the lines took); the few connections that ask for a request after
-- the last line get GET /healthz, which done() does not count as a login. It also primes the Go peer A/B
-- (every token's user signed in once, on each side): URLPATH=/v1/auth/apple and
-- BODY_FMT=both send the peers' body, {"id_token":T,"identity_token":T}. BODY_FMT=raw posts each
-- line as it is (pre-signed notification bodies: URLPATH=/v1/apple/notifications).
--   TOKENS=file API_KEY=abk_… [URLPATH=…] [BODY_FMT=both] \
--     wrk -t1 -c32 -d15s --latency -s bench/login-once.lua http://127.0.0.1:PORT
local lines = {}
index = 0   -- globals: done() reads them through thread:get()
total = 0
local answered = 0
local threads = {}
local api_key = os.getenv("API_KEY")
local path = os.getenv("URLPATH") or "/v1/apple/login"
local both = os.getenv("BODY_FMT") == "both"
local raw = os.getenv("BODY_FMT") == "raw"

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  for line in io.lines(os.getenv("TOKENS")) do
    if #line > 0 then lines[#lines + 1] = line end
  end
  total = #lines
  wrk.headers["Content-Type"] = "application/json"
  if api_key and api_key ~= "" then wrk.headers["Authorization"] = "Bearer " .. api_key end
end

function request()
  index = index + 1
  if index > #lines then
    return wrk.format("GET", "/healthz", nil, nil)
  end
  if raw then return wrk.format("POST", path, nil, lines[index]) end
  local token, code = lines[index]:match("^(%S+)%s*(%S*)$")
  local body = '{"identity_token":"' .. token .. '"'
  if both then body = '{"id_token":"' .. token .. '","identity_token":"' .. token .. '"' end
  if code ~= "" then body = body .. ',"authorization_code":"' .. code .. '"' end
  return wrk.format("POST", path, nil, body .. "}")
end

function response(status, headers, body)
  answered = answered + 1
  if answered == #lines then
    local done_file = os.getenv("DONE_FILE")
    if done_file then io.open(done_file, "w"):close() end
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local logins, exhausted = 0, 0
  for _, thread in ipairs(threads) do
    local sent, lines_total = thread:get("index"), thread:get("total")
    logins = logins + math.min(sent, lines_total)
    if sent >= lines_total then exhausted = 1 end
  end
  io.write(string.format("non2xx=%d\n", summary.errors.status))
  io.write(string.format("logins=%d exhausted=%d\n", logins, exhausted))
end

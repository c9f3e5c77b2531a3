-- gateway_rate: take one request from the token bucket of an API key (or, without keys, of a
-- client address), shared by every gateway process.
-- KEYS[1] the bucket (hash: tokens, at ms)
-- ARGV[1] rate (tokens a second)   ARGV[2] burst (most tokens it holds)
-- Returns {1, 0} when the request may go, else {0, ms until a token is there}.
local rate, burst = tonumber(ARGV[1]), math.max(tonumber(ARGV[2]) or 1, 1)
local now = now_ms()
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(b[1]), tonumber(b[2])
if not tokens or not at then tokens, at = burst, now end
tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
local taken, wait = 0, 0
if tokens >= 1 then
  tokens, taken = tokens - 1, 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'at', jint(now))
-- (an idle bucket refills to full within burst/rate seconds: after that it need not exist)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {taken, wait}

-- errtext is a caught error as one line: a Redis error reply ("OOM ...",
-- "READONLY ...", "WRONGTYPE ...") or a Lua error message.
local function errtext(e)
  if type(e) == 'table' then e = e.err end
  return (string.gsub(tostring(e), '[\r\n]', ' '))
end

-- line_of decides one segment and returns its reply line: the decisions,
-- or "!" and the error that failed it (its validation, or a Redis or Lua
-- error under pcall).
local function line_of(seg)
  if seg.err then return '!' .. seg.err end
  if seg.now then
    now, pinned = seg.now, true
  else
    now, pinned = server_now, false
  end
  local ok, line
  if seg.fast then
    ok, line = pcall(fast_segment, seg)
  else
    ok, line = pcall(segment, seg)
  end
  if ok then return line end
  return '!' .. errtext(line)
end

local lines = {}
for s = 1, #segs do
  lines[s] = line_of(segs[s])
end
return concat(lines, '\n')

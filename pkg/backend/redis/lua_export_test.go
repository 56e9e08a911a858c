package redis

// TakeLua is take.lua as the Store sends it (the parts of take/*.lua
// joined), for the external tests that EVAL it directly.
var TakeLua = takeLua

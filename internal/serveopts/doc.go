// Package serveopts holds the settings of `ratelimitd serve`: its flags,
// their RATELIMITD_* environment twins, the envoyproxy/ratelimit variables
// that map onto them (through internal/compat), their defaults and their
// validation, read into one Options (Parse). The settings table
// (settings.go) is the one source of the flags, the twins, `serve -h`, the
// README's flag table and docs/flags.md.
//
// Options then builds each package's options (ServiceOptions,
// redisOptions, XDSOptions, ...) and the stores of --backend (NewStore);
// cmd/ratelimitd wires the server from them.
package serveopts

package main

import (
	"io"

	"github.com/ratelimitd/ratelimitd/internal/serveopts"
	"github.com/ratelimitd/ratelimitd/internal/validatecmd"
)

// validate is `ratelimitd validate` (validatecmd.Run) with serve's
// defaults.
func validate(args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) int {
	def := serveopts.Defaults()
	return validatecmd.Run(args, validatecmd.Env{
		Lookup: lookup,
		Defaults: validatecmd.Defaults{
			MergeDomains: def.MergeDomains, IgnoreDotfiles: def.IgnoreDotfiles,
			MaxConfigRules: def.MaxConfigRules, MaxConfigBytes: def.MaxConfigBytes,
		},
	}, stdout, stderr)
}

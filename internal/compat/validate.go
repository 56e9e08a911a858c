package compat

import (
	"fmt"
	"strings"
)

// ValidateMode is the mode serve would resolve from the environment for
// `ratelimitd validate --mode=mode`, and why: serve's rule without
// --config (the PATHs checked are not --config).
func ValidateMode(mode string, lookup func(string) (string, bool)) (ref bool, reason string, err error) {
	switch mode {
	case ModeReference:
		return true, "--mode=reference", nil
	case ModeNative:
		return false, "--mode=native", nil
	case ModeAuto:
		for _, n := range []string{"RATELIMITD_CONFIG", "RATELIMITD_CONFIG_SOURCE"} {
			if _, ok := lookup(n); ok {
				return false, n + " given", nil
			}
		}
		if set := TriggersSet(lookup); len(set) > 0 {
			return true, "envoyproxy/ratelimit variables set: " + strings.Join(set, ", "), nil
		}
		return false, "no envoyproxy/ratelimit variable set", nil
	}
	return false, "", fmt.Errorf("--mode=%q: want one of auto, reference, native", mode)
}

// ConfigPaths are the config paths serve loads in reference mode:
// RATELIMITD_CONFIG, else ConfigDir (ReferenceConfigDir when no RUNTIME_*
// variable is set). A config from xDS (RATELIMITD_CONFIG_SOURCE=xds,
// CONFIG_TYPE=GRPC_XDS_SOTW) has no path to check: an error.
func ConfigPaths(lookup func(string) (string, bool)) ([]string, error) {
	get := func(n string) (string, bool) { v, ok := lookup(n); return strings.TrimSpace(v), ok }
	source := ""
	if v, ok := get("CONFIG_TYPE"); ok && strings.EqualFold(v, "GRPC_XDS_SOTW") {
		source = "CONFIG_TYPE=" + v
	}
	if v, ok := get("RATELIMITD_CONFIG_SOURCE"); ok {
		source = ""
		if strings.EqualFold(v, "xds") {
			source = "RATELIMITD_CONFIG_SOURCE=" + v
		}
	}
	if source != "" {
		return nil, fmt.Errorf("the config comes from xDS (%s): give the PATHs of the files to check", source)
	}
	if v, ok := get("RATELIMITD_CONFIG"); ok && v != "" {
		return splitList(v), nil
	}
	if dir, ok := ConfigDir(get); ok {
		return []string{dir}, nil
	}
	return []string{ReferenceConfigDir}, nil
}

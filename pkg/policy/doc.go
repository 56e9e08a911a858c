// Package policy loads, validates and compiles rate-limit configuration in
// the YAML format of envoyproxy/ratelimit (plus ratelimitd's extensions)
// and answers which rule applies to a request descriptor. It imports
// pkg/algo and the standard library only; the service, the backends and
// the command build on it. docs/config.md is the user reference for the
// format.
//
// # Set
//
// A *Set is one compiled, immutable configuration: per domain a descriptor
// tree, every Rule (a descriptor node carrying rate_limit, rate_limits or
// unlimited: true) with its Specs (one per limit, each with the compiled
// algo.Limit), and the KeyOptions that shape backend keys. A Set is safe
// for concurrent use and never changes; a reload builds a new one. The
// service calls (*Set).Match (or (*Set).Override for a request limit
// override) once per request descriptor and (*Set).Key once per applied
// limit; nil and the zero Set match nothing.
//
// # Loading and validation
//
// Load reads files and directories, LoadSources documents held in memory
// (configs delivered over xDS). Both parse every file (one YAML document
// each: domain, descriptors, plans, override), then compile all of them
// together, and report every problem at once: the error joins
// *ConfigError values, each printing as "file:line: message" with the
// position of the offending key. A non-nil error means no Set: a config
// with any problem never loads. LoadOptions bound a load (MaxRules,
// MaxBytes) and restrict it to the algorithms a backend decides
// (Algorithms). Warnings are lint findings that do not reject a load.
//
// # Reload and swap
//
// Watch loads the config, then reloads whenever one of its files changes
// (Kubernetes ConfigMap symlink swaps included), calling apply with each
// good Set and fail with each error; the Set in force stays until a good
// one replaces it. The caller swaps Sets atomically (service.SetPolicy):
// requests in flight finish on the Set they started with. (*Set).SourceHash
// tells a reload that changed nothing.
//
// # Backend keys
//
// (*Set).Key builds the store key of one limit of a match: a versioned,
// length-prefixed encoding of domain, rule path, limit index, algorithm,
// window and identity entries, hashed with SHA-256 unless
// KeyOptions.ClearText. The grammar is documented in key.go and, for
// operators, in docs/config.md ("Backend keys"); a golden test pins it.
//
// # Files
//
// parse.go decodes one YAML document; yamlnode.go and merge.go read YAML
// nodes and merge keys; descriptor.go, limit.go, ruleoptions.go,
// override.go, plans.go and plannodes.go parse the parts of a file (the
// plans form expands into descriptors); suggest.go proposes the key meant
// by an unknown one; compile.go builds the Set and lint.go finds what it
// warns about; set.go, pattern.go and key.go answer requests; address.go
// holds the address options (CIDR values, ipv6_prefix, cgnat) and
// variants.go reserve and the rule variants Match returns for them; hash.go and
// explain.go describe a Set; load.go reads files, and watch.go and
// watchplan.go reload them.
package policy

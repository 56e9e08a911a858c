package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Load reads YAML files and compiles them into a Set. A directory is
// walked recursively in lexical order for .yaml and .yml files, following
// symbolic links to files but not to directories; opts.IgnoreDotFiles skips
// names starting with '.' (Kubernetes ConfigMap ..data and ..<timestamp>).
//
// Every problem is reported at once: the error joins *ConfigError values,
// each printing as "file:line: message", and a non-nil error means no Set.
// Warnings are returned either way. No config file at all yields an empty
// Set and one warning, but a path that does not exist is an error, so a
// deleted file given directly keeps the previous Set in force under Watch.
func Load(opts LoadOptions, paths ...string) (*Set, []Warning, error) {
	s, warns, _, err := loadSource(opts, paths)
	return s, warns, err
}

// loadSource is Load, also returning the source hash of the bytes read
// (Set.SourceHash when the load succeeds), with or without an error.
func loadSource(opts LoadOptions, paths []string) (*Set, []Warning, string, error) {
	errs := &errList{}
	src := readSources(opts, paths, errs)
	return compileSources(opts, src, errs, "from "+strings.Join(paths, ", ")+" (no .yaml or .yml config files)")
}

// Source is one config document held in memory instead of a file: a
// config delivered over xDS (a RateLimitConfig resource) in its YAML form.
type Source struct {
	// Name stands for the file name in errors and warnings ("Name:line:
	// message"), in Rule.File and in /rlconfig; it should say where the
	// document came from (e.g. "xds:<resource name>").
	Name string
	// Data is one YAML document with the layout of a config file.
	Data []byte
}

// LoadSources is Load for documents held in memory: each Source is parsed,
// validated and compiled exactly as a config file is, and LoadOptions.MaxBytes
// bounds the sum of their Data. The Set's SourceHash covers the options and
// every Name and Data, so loading the same sources twice is a no-op reload.
func LoadSources(opts LoadOptions, srcs ...Source) (*Set, []Warning, error) {
	errs := &errList{}
	var out sources
	h := sha256.New()
	fmt.Fprintf(h, "ratelimitd-memory-v1 merge=%t clear=%t prefix=%d:%s\n",
		opts.MergeDomains, opts.Keys.ClearText, len(opts.Keys.Prefix), opts.Keys.Prefix)
	var total int64
	for _, src := range srcs {
		total += int64(len(src.Data))
		if opts.MaxBytes > 0 && total > opts.MaxBytes {
			errs.add("config", 0, "config too large: more than the limit of %d bytes (--max-config-bytes) at %s; the config in force, if any, stays", opts.MaxBytes, src.Name)
			fmt.Fprintf(h, "too large %d:%s\n", len(src.Name), src.Name)
			out.files = nil
			break
		}
		fmt.Fprintf(h, "source %d:%s %d:", len(src.Name), src.Name, len(src.Data))
		h.Write(src.Data)
		out.files = append(out.files, sourceFile{name: src.Name, data: src.Data})
	}
	out.hash = hex.EncodeToString(h.Sum(nil))
	s, warns, _, err := compileSources(opts, out, errs, "(no config documents)")
	return s, warns, err
}

// compileSources parses and compiles what one load read; empty describes
// the inputs in the warning of a load without domains.
func compileSources(opts LoadOptions, src sources, errs *errList, empty string) (*Set, []Warning, string, error) {
	var parsed []*fileConfig
	for _, f := range src.files {
		parsed = append(parsed, parseFile(f.name, f.data, errs, opts.LiteralValues))
	}
	s := compile(parsed, opts, errs)
	if opts.MaxRules > 0 && len(s.rules) > opts.MaxRules {
		errs.add("config", 0, "config too large: %d rules, more than the limit of %d (--max-config-rules); the config in force, if any, stays", len(s.rules), opts.MaxRules)
	}
	errs.sort()
	if len(errs.errs) > 0 {
		return nil, errs.warnings, src.hash, errors.Join(errs.errs...)
	}
	if len(s.domains) == 0 {
		// Valid but almost certainly not meant: a directory without
		// config files (or whose files were all deleted) loads an empty
		// Set, and the service then answers every request OK.
		errs.warn("", 0, "no rate-limit domains loaded %s: every request is answered OK without limits", empty)
	}
	s.computeHash()
	s.sourceHash = src.hash
	return s, errs.warnings, src.hash, nil
}

// sources is what one load read: the files, in load order, and the hex
// SHA-256 of everything read (see Set.SourceHash).
type sources struct {
	files []sourceFile
	hash  string
}

type sourceFile struct {
	name string
	data []byte
}

// readSources reads the config files of paths, recording read problems in
// errs. The hash covers exactly the bytes read and the load options, each
// field length-prefixed so that distinct inputs never collide; a file
// that could not be read counts as "unreadable" in it.
func readSources(opts LoadOptions, paths []string, errs *errList) sources {
	var out sources
	h := sha256.New()
	fmt.Fprintf(h, "ratelimitd-source-v1 merge=%t dot=%t clear=%t prefix=%d:%s\n",
		opts.MergeDomains, opts.IgnoreDotFiles, opts.Keys.ClearText, len(opts.Keys.Prefix), opts.Keys.Prefix)
	var total int64
	for _, f := range collectFiles(opts, paths, errs) {
		if opts.MaxBytes > 0 {
			if st, err := os.Stat(f); err == nil && total+st.Size() > opts.MaxBytes {
				errs.add("config", 0, "config too large: more than the limit of %d bytes (--max-config-bytes) at %s; the config in force, if any, stays", opts.MaxBytes, f)
				fmt.Fprintf(h, "too large %d:%s\n", len(f), f)
				out.files = nil
				break
			}
		}
		data, err := os.ReadFile(f)
		if err != nil {
			errs.addRead(f, err, "cannot read config file: %v", err)
			fmt.Fprintf(h, "unreadable %d:%s\n", len(f), f)
			continue
		}
		total += int64(len(data))
		if opts.MaxBytes > 0 && total > opts.MaxBytes {
			errs.add("config", 0, "config too large: more than the limit of %d bytes (--max-config-bytes) at %s; the config in force, if any, stays", opts.MaxBytes, f)
			fmt.Fprintf(h, "too large %d:%s\n", len(f), f)
			out.files = nil
			break
		}
		fmt.Fprintf(h, "file %d:%s %d:", len(f), f, len(data))
		h.Write(data)
		out.files = append(out.files, sourceFile{name: f, data: data})
	}
	out.hash = hex.EncodeToString(h.Sum(nil))
	return out
}

func isYAML(name string) bool {
	ext := strings.ToLower(filepath.Ext(name))
	return ext == ".yaml" || ext == ".yml"
}

// collectFiles expands paths into the list of files to load, in order,
// without duplicates unless opts.RepeatPaths.
func collectFiles(opts LoadOptions, paths []string, errs *errList) []string {
	out, _ := collectPaths(opts, paths, errs)
	return out
}

// collectPaths is collectFiles, also returning the dangling symlinks it
// skipped.
func collectPaths(opts LoadOptions, paths []string, errs *errList) (out, skipped []string) {
	seen := map[string]bool{}
	addFile := func(p string) {
		c := filepath.Clean(p)
		if !seen[c] || opts.RepeatPaths {
			seen[c] = true
			out = append(out, p)
		}
	}
	// A dangling symlink in a directory points at no file, as a deleted
	// file is none: it is skipped with a warning, so it cannot block
	// every reload. Alone, it is an error: loading nothing in its place
	// would replace the config in force with an empty one.
	type danglingLink struct {
		path string
		err  error
	}
	var dangling []danglingLink
	if len(paths) == 0 {
		errs.add("config", 0, "no config path given")
	}
	for _, root := range paths {
		st, err := os.Stat(root)
		if err != nil {
			errs.addRead(root, err, "cannot read config path: %v", err)
			continue
		}
		if !st.IsDir() {
			addFile(root)
			continue
		}
		err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				errs.addRead(p, err, "cannot read config path: %v", err)
				return nil
			}
			if p == root {
				return nil
			}
			if opts.IgnoreDotFiles && strings.HasPrefix(d.Name(), ".") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if d.IsDir() || !isYAML(d.Name()) {
				return nil
			}
			if d.Type()&fs.ModeSymlink != 0 {
				st, err := os.Stat(p)
				if errors.Is(err, fs.ErrNotExist) {
					dangling = append(dangling, danglingLink{p, err})
					return nil
				}
				if err != nil {
					errs.addRead(p, err, "cannot read config file: %v", err)
					return nil
				}
				if !st.Mode().IsRegular() {
					return nil
				}
			} else if !d.Type().IsRegular() {
				return nil
			}
			addFile(p)
			return nil
		})
		if err != nil {
			errs.addRead(root, err, "cannot walk config directory: %v", err)
		}
	}
	for _, l := range dangling {
		if len(out) == 0 {
			errs.addRead(l.path, l.err, "cannot read config file: a dangling symlink, and no other config file: %v", l.err)
		} else {
			errs.warn(l.path, 0, "skipped: a dangling symlink (%v); the other config files are loaded", l.err)
			skipped = append(skipped, l.path)
		}
	}
	return out, skipped
}

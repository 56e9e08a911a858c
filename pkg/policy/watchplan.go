package policy

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fsnotify/fsnotify"
)

// watchPlan is what Watch reacts to, computed from the file system just
// before each load. Paths are canonical: the directory part resolved
// through symlinks (filepath.EvalSymlinks), the last element kept, which is
// how fsnotify names the events of the (canonical) directories watched.
type watchPlan struct {
	dirs      map[string]bool // directories to watch
	names     map[string]bool // files given, files loaded and their symlink targets
	roots     []string        // directories given
	links     []watchLink     // loaded files whose path involves a symlink
	ignoreDot bool
	// missing: the directory of a file given does not exist (yet), so its
	// nearest existing ancestor is watched instead.
	missing bool
}

// watchLink is a loaded file whose canonical target differs from its
// canonical name; target is "" when it did not resolve.
type watchLink struct{ path, target string }

// canonDir resolves a directory through symlinks (Clean when it cannot).
func canonDir(d string) string {
	if r, err := filepath.EvalSymlinks(d); err == nil {
		return r
	}
	return filepath.Clean(d)
}

// canonName resolves p's directory, keeping its last element.
func canonName(p string) string {
	p = filepath.Clean(p)
	return filepath.Join(canonDir(filepath.Dir(p)), filepath.Base(p))
}

// resolve is p's symlink target, "" when it does not resolve.
func resolve(p string) string {
	t, err := filepath.EvalSymlinks(p)
	if err != nil {
		return ""
	}
	return t
}

// existingAncestor is dir, canonical, when it is a directory; else the
// nearest ancestor that is (fsnotify cannot watch a missing path), each
// missing element on the way recorded in names: its creation (mkdir, a
// rename into place) is the event that moves the watch one level down.
func (p *watchPlan) existingAncestor(dir string) string {
	dir = filepath.Clean(dir)
	for {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return canonDir(dir)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return dir // the root itself is missing: watching it fails
		}
		p.missing = true
		p.names[canonName(dir)] = true
		dir = parent
	}
}

func newWatchPlan(opts LoadOptions, paths []string) *watchPlan {
	p := &watchPlan{dirs: map[string]bool{}, names: map[string]bool{}, ignoreDot: opts.IgnoreDotFiles}
	for _, root := range paths {
		st, err := os.Stat(root)
		if err != nil || !st.IsDir() {
			// A file, or a path that does not exist (yet): watch its
			// directory for it, or its nearest existing ancestor.
			p.names[canonName(root)] = true
			p.dirs[p.existingAncestor(filepath.Dir(root))] = true
			continue
		}
		p.roots = append(p.roots, canonDir(root))
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if path != root && opts.IgnoreDotFiles && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			p.dirs[canonDir(path)] = true
			return nil
		})
	}
	// A symlink on the way to a path given (rr/current -> v1 above
	// rr/current/ratelimit/config) is watched in its own directory, so
	// that swapping it reloads, and the next plan follows the new target.
	for _, root := range paths {
		symlinksOnPath(root, func(dir, link string) {
			p.dirs[dir] = true
			p.names[link] = true
		})
	}
	// The same expansion as Load, so the same extension and dotfile rules.
	// A dangling symlink skipped is watched as a loaded symlink that does
	// not resolve: its target appearing is a change.
	files, skipped := collectPaths(opts, paths, &errList{})
	for _, f := range skipped {
		p.names[canonName(f)] = true
		p.links = append(p.links, watchLink{path: f})
	}
	for _, f := range files {
		name := canonName(f)
		p.names[name] = true
		switch target := resolve(f); target {
		case name:
		case "":
			p.links = append(p.links, watchLink{path: f})
		default:
			p.names[target] = true
			p.dirs[filepath.Dir(target)] = true
			p.links = append(p.links, watchLink{path: f, target: target})
		}
	}
	return p
}

// loadable reports whether name, a canonical path, lies under a directory
// given to Load along a path the loader walks (no dot element with
// IgnoreDotFiles).
func (p *watchPlan) loadable(name string) bool {
	for _, root := range p.roots {
		rel, err := filepath.Rel(root, name)
		if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			continue
		}
		if p.ignoreDot && slices.ContainsFunc(strings.Split(rel, string(filepath.Separator)), func(e string) bool {
			return strings.HasPrefix(e, ".")
		}) {
			continue
		}
		return true
	}
	return false
}

// relevant reports whether ev may change what Load reads.
func (p *watchPlan) relevant(ev fsnotify.Event) bool {
	if !ev.Has(fsnotify.Create) && !ev.Has(fsnotify.Write) && !ev.Has(fsnotify.Remove) && !ev.Has(fsnotify.Rename) {
		return false // Chmod only: touch, permission bits, indexers
	}
	name := filepath.Clean(ev.Name)
	if p.names[name] {
		return true
	}
	structural := ev.Has(fsnotify.Create) || ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)
	if p.loadable(name) {
		if isYAML(name) {
			return true
		}
		if ev.Has(fsnotify.Create) {
			// A new subdirectory to walk (symlinks to directories are
			// not followed by the loader).
			if st, err := os.Lstat(name); err == nil && st.IsDir() {
				return true
			}
		}
		if (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) && p.dirs[name] {
			return true
		}
	}
	if !structural {
		return false // a Write cannot retarget a symlink
	}
	for _, l := range p.links {
		if resolve(l.path) != l.target {
			return true
		}
	}
	return false
}

// maxSymlinkHops bounds the symlinks symlinksOnPath follows (a loop ends
// there, as the kernel's ELOOP does).
const maxSymlinkHops = 40

// symlinksOnPath resolves p one element at a time, as the kernel does, and
// calls found with the canonical directory and name of each symlink met on
// the way, including those inside a symlink's target. It stops at the first
// element that does not exist.
func symlinksOnPath(p string, found func(dir, link string)) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return
	}
	sep := string(filepath.Separator)
	cur := filepath.VolumeName(abs) + sep
	rest := strings.Split(abs[len(cur):], sep)
	for hops := 0; len(rest) > 0; {
		e := rest[0]
		rest = rest[1:]
		switch e {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, e)
		st, err := os.Lstat(next)
		if err != nil {
			return
		}
		if st.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > maxSymlinkHops {
			return
		}
		found(cur, next)
		target, err := os.Readlink(next)
		if err != nil {
			return
		}
		if filepath.IsAbs(target) {
			cur = filepath.VolumeName(target) + sep
			target = target[len(cur):]
		}
		rest = append(strings.Split(target, sep), rest...)
	}
}

package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/doccheck"
)

// mapDocs are the pages whose code spans name files and Go identifiers of
// the repository; TestMapNamesExist checks each name against the tree.
var mapDocs = []string{"docs/architecture.md"}

// externalNames are code spans of mapDocs that name something outside this
// module's Go code (protobuf messages, gRPC services, Redis commands);
// they are not looked up.
var externalNames = map[string]bool{
	"RateLimitConfig": true, "RateLimitRequest": true, "ShouldRateLimit": true, "RateLimitDescriptor.limit": true,
	"grpc.Server": true, "atomic.Pointer": true, "prometheus.Registerer": true,
	"envoy.service.ratelimit.v3.RateLimitService": true, "ratelimitd.admin.v1.Admin": true,
	// gRPC status codes.
	"InvalidArgument": true, "Unknown": true, "Unavailable": true, "DeadlineExceeded": true, "Canceled": true,
}

var (
	codeSpan  = regexp.MustCompile("`([^`\n]+)`")
	identSpan = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
	pathSpan  = regexp.MustCompile(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/?$`)
	fileExt   = regexp.MustCompile(`\.(go|lua|md|sh|proto|yaml|yml|golden)$`)
)

// goNames indexes the module's Go declarations: package names, top-level
// names (functions, types, constants, variables), and Type.Member for
// methods, struct fields and interface methods. Test files count: the map
// also names tests.
type goNames struct {
	pkgs    map[string]bool            // package name
	top     map[string]map[string]bool // package name -> top-level names
	members map[string]bool            // Type.Member, any package
	any     map[string]bool            // every top-level name or member name
	// files maps a file's path to what it declares: its top-level names
	// and its Type.Member (methods; fields and interface methods of the
	// types it declares).
	files map[string]map[string]bool
	// pkgOf maps a file's path to its package name (without _test).
	pkgOf map[string]string
	// dirs maps a directory to its Go files.
	dirs map[string][]string
}

func indexGo(t *testing.T, files []string) goNames {
	t.Helper()
	n := goNames{pkgs: map[string]bool{}, top: map[string]map[string]bool{}, members: map[string]bool{}, any: map[string]bool{},
		files: map[string]map[string]bool{}, pkgOf: map[string]string{}, dirs: map[string][]string{}}
	fset := token.NewFileSet()
	for _, f := range files {
		if !strings.HasSuffix(f, ".go") || strings.Contains(f, "/testdata/") {
			continue
		}
		af, err := parser.ParseFile(fset, "", readRepo(t, f), parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parse %s: %v", f, err)
		}
		pkg := strings.TrimSuffix(af.Name.Name, "_test")
		n.pkgs[pkg] = true
		if n.top[pkg] == nil {
			n.top[pkg] = map[string]bool{}
		}
		decl := map[string]bool{}
		n.files[f], n.pkgOf[f] = decl, pkg
		n.dirs[path.Dir(f)] = append(n.dirs[path.Dir(f)], f)
		addTop := func(name string) { n.top[pkg][name], n.any[name], decl[name] = true, true, true }
		for _, d := range af.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil && len(d.Recv.List) > 0 {
					if r := doccheck.Receiver(d.Recv.List[0].Type); r != "" {
						n.members[r+"."+d.Name.Name], n.any[d.Name.Name], decl[r+"."+d.Name.Name] = true, true, true
					}
					continue
				}
				addTop(d.Name.Name)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						addTop(s.Name.Name)
						if list := doccheck.Members(s); list != nil {
							for _, fl := range list.List {
								for _, id := range fl.Names {
									n.members[s.Name.Name+"."+id.Name], n.any[id.Name], decl[s.Name.Name+"."+id.Name] = true, true, true
								}
							}
						}
					case *ast.ValueSpec:
						for _, id := range s.Names {
							addTop(id.Name)
						}
					}
				}
			}
		}
	}
	return n
}

// resolves reports whether a dotted name exists: pkg.Name, pkg.Type.Member,
// Type.Member, or a bare Go name declared somewhere in the module.
func (n goNames) resolves(name string) bool {
	parts := strings.Split(name, ".")
	if n.pkgs[parts[0]] && len(parts) > 1 {
		if !n.top[parts[0]][parts[1]] {
			return false
		}
		return len(parts) == 2 || n.members[parts[1]+"."+parts[2]]
	}
	switch len(parts) {
	case 1:
		return n.any[name]
	case 2:
		return n.members[name]
	}
	return false
}

// goLike reports whether a code span is meant as a Go name: it has a dot,
// or it mixes lower and upper case the way Go identifiers do.
func goLike(s string) bool {
	if strings.Contains(s, ".") {
		return true
	}
	lower, upper := strings.ToLower(s) != s, strings.ToUpper(s) != s
	return lower && upper && !strings.Contains(s, "_")
}

// declaredAt reports whether place, a file or a directory, declares the
// dotted name (see declaredIn); a directory declares what its files do.
func (n goNames) declaredAt(place, name string) bool {
	if strings.HasSuffix(place, ".go") {
		return n.declaredIn(place, name)
	}
	return slices.ContainsFunc(n.dirs[place], func(f string) bool { return n.declaredIn(f, name) })
}

// declaredIn reports whether file declares the dotted name: pkg.Name,
// pkg.Type.Member, Type.Member or Name (a top-level name, or a method of
// any type), with pkg the file's package.
func (n goNames) declaredIn(file, name string) bool {
	decl := n.files[file]
	if decl == nil {
		return false
	}
	if pkg, rest, ok := strings.Cut(name, "."); ok && pkg == n.pkgOf[file] {
		name = rest
	}
	if decl[name] {
		return true
	}
	if !strings.Contains(name, ".") {
		for d := range decl {
			if strings.HasSuffix(d, "."+name) {
				return true
			}
		}
	}
	return false
}

// A span's place: which file or package declares the Go names of a page
// is said by writing it after them, "`A`, `B` and `C` (`dir/file.go`)",
// "`TestX` (`pkg/service`)", or before them, "`dir/file.go`: `A`, `B`",
// "`pkg/replay` `TestY`". A bare file name ("`store.go`") is in the
// directory of the path named last before it.
var (
	nameSep   = regexp.MustCompile(`^(\(\))?(,\s*|\s+and\s+|,\s+and\s+)$`)
	openParen = regexp.MustCompile(`^(\(\))?\s*\(\s*$`)
	colonSep  = regexp.MustCompile(`^(:\s*|\s+)$`)
)

// mapSpan is one code span of a page.
type mapSpan struct {
	text       string // without a trailing "()"
	start, end int    // byte offsets of the span, backquotes included
	line       int
	goName     bool
	// place is, for a path span of a tracked .go file or of a directory
	// holding Go files, that path ("" otherwise): the Go names written
	// with it must be declared there.
	place string
}

// docIndex is what the span checks look names up in.
type docIndex struct {
	refs   *repoRefs
	bases  map[string]bool // base names of tracked files
	isFile map[string]bool // tracked files
	names  goNames
}

// spans returns the code spans of doc (text). strict (a map page)
// reports every path or Go name that does not exist; otherwise such
// spans are only left out of the placement checks.
func (x docIndex) spans(t *testing.T, doc, text string, strict bool) (spans []mapSpan, checked int) {
	t.Helper()
	errorf := func(format string, args ...any) {
		if strict {
			t.Errorf(format, args...)
		}
	}
	lastDir := ""
	for _, m := range codeSpan.FindAllStringSubmatchIndex(text, -1) {
		sp := mapSpan{text: strings.TrimSuffix(text[m[2]:m[3]], "()"), start: m[0], end: m[1],
			line: 1 + strings.Count(text[:m[0]], "\n")}
		s := sp.text
		if externalNames[s] {
			spans = append(spans, sp)
			continue
		}
		switch {
		case pathSpan.MatchString(s) && (strings.Contains(s, "/") || fileExt.MatchString(s)):
			checked++
			p := strings.TrimSuffix(s, "/")
			if !strings.Contains(s, "/") {
				if !x.bases[p] {
					errorf("%s:%d: file %q: no tracked file has that name", doc, sp.line, s)
				}
				if strings.HasSuffix(p, ".go") {
					if full := path.Join(lastDir, p); x.isFile[full] {
						sp.place = full
					} else {
						errorf("%s:%d: file %q: not in %s, the directory named last before it", doc, sp.line, s, lastDir)
					}
				}
				break
			}
			p = path.Clean(p)
			if why := x.refs.check(p, ""); why != "" {
				errorf("%s:%d: path %q: %s", doc, sp.line, s, why)
				break
			}
			if x.isFile[p] {
				lastDir = path.Dir(p)
				if strings.HasSuffix(p, ".go") {
					sp.place = p
				}
			} else {
				lastDir = p
				if x.names.dirs[p] != nil {
					sp.place = p
				}
			}
		case identSpan.MatchString(s) && goLike(s):
			checked++
			sp.goName = x.names.resolves(s)
			if !sp.goName {
				errorf("%s:%d: %q is not declared in the module's Go code (rename it here, or list it in externalNames)", doc, sp.line, s)
			}
		}
		spans = append(spans, sp)
	}
	return spans, checked
}

// checkPlacement checks that each Go name written with a file (see
// nameSep) is declared in that file, and returns how many it checked.
func (x docIndex) checkPlacement(t *testing.T, doc, text string, spans []mapSpan) (placed int) {
	t.Helper()
	between := func(i int) string { return text[spans[i-1].end:spans[i].start] }
	checkIn := func(sp mapSpan, place string) {
		placed++
		if !x.names.declaredAt(place, sp.text) {
			t.Errorf("%s:%d: %q is not declared in %s, the file or package named with it", doc, sp.line, sp.text, place)
		}
	}
	for i, sp := range spans {
		if sp.place == "" {
			continue
		}
		// Names before: "`A`, `B` (`file.go`)".
		if i > 0 && openParen.MatchString(between(i)) {
			for j := i - 1; j >= 0 && spans[j].goName; j-- {
				checkIn(spans[j], sp.place)
				if j == 0 || !nameSep.MatchString(between(j)) {
					break
				}
			}
		}
		// Names after: "`file.go`: `A`, `B`", "`file.go` `A`".
		if i+1 < len(spans) && colonSep.MatchString(between(i+1)) {
			for j := i + 1; j < len(spans) && spans[j].goName; j++ {
				checkIn(spans[j], sp.place)
				if j+1 == len(spans) || !nameSep.MatchString(between(j+1)) {
					break
				}
			}
		}
	}
	return placed
}

func newDocIndex(t *testing.T) (docIndex, []string) {
	t.Helper()
	files := tracked(t)
	x := docIndex{refs: newRepoRefs(t, files), bases: map[string]bool{}, isFile: map[string]bool{}, names: indexGo(t, files)}
	for _, f := range files {
		x.bases[path.Base(f)] = true
		x.isFile[f] = true
	}
	return x, files
}

// TestMapNamesExist: every Go name the map pages cite exists, in the file
// they place it in.
func TestMapNamesExist(t *testing.T) {
	x, _ := newDocIndex(t)
	checked, placed := 0, 0
	for _, doc := range mapDocs {
		text := string(readRepo(t, doc))
		spans, n := x.spans(t, doc, text, true)
		checked += n
		placed += x.checkPlacement(t, doc, text, spans)
	}
	if checked < 50 {
		t.Fatalf("only %d names checked: the patterns are broken", checked)
	}
	if placed < 30 {
		t.Fatalf("only %d names checked against their file: the patterns are broken", placed)
	}
}

// TestDocsNamePlacement checks, in every Markdown page of the
// repository, that a Go name of the module written with a file, as in
// "`pkg/service/decide.go` `decide`" or "`Set.Key` (`pkg/policy/key.go`)",
// is declared in that file: a page that says which file holds what goes
// stale when code moves. Names and paths that do not resolve are not
// checked here (only the map pages must name nothing else).
func TestDocsNamePlacement(t *testing.T) {
	x, files := newDocIndex(t)
	placed := 0
	for _, doc := range files {
		if !strings.HasSuffix(doc, ".md") || slices.Contains(mapDocs, doc) {
			continue
		}
		text := string(readRepo(t, doc))
		spans, _ := x.spans(t, doc, text, false)
		placed += x.checkPlacement(t, doc, text, spans)
	}
	if placed == 0 {
		t.Fatal("no name checked against its file: the patterns are broken")
	}
}

// TestMapPackageTable checks the package table of docs/architecture.md
// ("## Packages") against the module and mayImport: one row per mayImport
// entry (a row "`dir` (and below)" is the entry "dir/..."), and its last
// column lists exactly the entry's packages as code spans, before any
// parenthesized remark ("its own subpackages" is the row's own
// "dir/..."; "—" and "nothing" are none). TestImportDirection checks
// mayImport against `go list ./...`, so the table matches both.
func TestMapPackageTable(t *testing.T) {
	const doc = "docs/architecture.md"
	text := string(readRepo(t, doc))
	_, table, ok := strings.Cut(text, "\n## Packages\n")
	if !ok {
		t.Fatalf("%s: no \"## Packages\" section", doc)
	}
	table, _, _ = strings.Cut(table, "\n## ")
	rows := map[string][]string{}
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if !strings.HasPrefix(line, "| `") || len(cells) != 3 {
			continue
		}
		m := codeSpan.FindStringSubmatch(cells[0])
		if m == nil {
			t.Errorf("%s: row %q: the first column is not a package", doc, line)
			continue
		}
		key := m[1]
		if strings.Contains(cells[0], "(and below)") {
			key += "/..."
		}
		if _, dup := rows[key]; dup {
			t.Errorf("%s: package %s has two rows", doc, key)
		}
		allowed, _, _ := strings.Cut(cells[2], "(")
		imps := []string{}
		if strings.Contains(allowed, "its own subpackages") {
			imps = append(imps, key)
		}
		for _, s := range codeSpan.FindAllStringSubmatch(allowed, -1) {
			imps = append(imps, s[1])
		}
		rows[key] = imps
	}
	for key, want := range mayImport {
		got, ok := rows[key]
		if !ok {
			t.Errorf("%s: no row for package %s (mayImport has it)", doc, key)
			continue
		}
		if !sameSet(got, want) {
			t.Errorf("%s: package %s may import %v by its row, %v by mayImport", doc, key, got, want)
		}
	}
	for key := range rows {
		if _, ok := mayImport[key]; !ok {
			t.Errorf("%s: row for package %s, which mayImport does not list (is it in `go list ./...`?)", doc, key)
		}
	}
}

// sameSet reports whether a and b hold the same strings.
func sameSet(a, b []string) bool {
	a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"regexp"
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
	"RateLimitConfig": true, "ShouldRateLimit": true, "RateLimitDescriptor.limit": true,
	"grpc.Server": true, "atomic.Pointer": true, "prometheus.Registerer": true,
	"envoy.service.ratelimit.v3.RateLimitService": true, "ratelimitd.admin.v1.Admin": true,
	// gRPC status codes.
	"InvalidArgument": true, "Unknown": true, "Unavailable": true, "DeadlineExceeded": true,
}

var (
	codeSpan  = regexp.MustCompile("`([^`]+)`")
	identSpan = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
	pathSpan  = regexp.MustCompile(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/?$`)
	fileExt   = regexp.MustCompile(`\.(go|lua|md|sh|proto|yaml|yml)$`)
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
}

func indexGo(t *testing.T, files []string) goNames {
	t.Helper()
	n := goNames{pkgs: map[string]bool{}, top: map[string]map[string]bool{}, members: map[string]bool{}, any: map[string]bool{}}
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
		addTop := func(name string) { n.top[pkg][name], n.any[name] = true, true }
		for _, d := range af.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil && len(d.Recv.List) > 0 {
					if r := doccheck.Receiver(d.Recv.List[0].Type); r != "" {
						n.members[r+"."+d.Name.Name], n.any[d.Name.Name] = true, true
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
									n.members[s.Name.Name+"."+id.Name], n.any[id.Name] = true, true
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

func TestMapNamesExist(t *testing.T) {
	files := tracked(t)
	refs := newRepoRefs(t, files)
	bases := map[string]bool{}
	for _, f := range files {
		bases[path.Base(f)] = true
	}
	names := indexGo(t, files)
	checked := 0
	for _, doc := range mapDocs {
		for i, line := range strings.Split(string(readRepo(t, doc)), "\n") {
			for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
				s := strings.TrimSuffix(m[1], "()")
				if externalNames[s] {
					continue
				}
				switch {
				case pathSpan.MatchString(s) && (strings.Contains(s, "/") || fileExt.MatchString(s)):
					checked++
					p := strings.TrimSuffix(s, "/")
					if !strings.Contains(s, "/") {
						if !bases[p] {
							t.Errorf("%s:%d: file %q: no tracked file has that name", doc, i+1, s)
						}
						continue
					}
					if why := refs.check(path.Clean(p), ""); why != "" {
						t.Errorf("%s:%d: path %q: %s", doc, i+1, s, why)
					}
				case identSpan.MatchString(s) && goLike(s):
					checked++
					if !names.resolves(s) {
						t.Errorf("%s:%d: %q is not declared in the module's Go code (rename it here, or list it in externalNames)", doc, i+1, s)
					}
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d names checked: the patterns are broken", checked)
	}
}

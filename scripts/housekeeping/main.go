// Command housekeeping prints the repository-level measures a maintainer
// watches: the largest source files by line count and the exported
// identifiers that have no doc comment.
//
// Usage (from the repository root):
//
//	go run ./scripts/housekeeping [-top N] [-list]
//
// It reads the Go, Lua and shell files git tracks (testdata and generated
// *.pb.go files excluded) and writes plain text to standard output. With
// -list, every undocumented exported identifier is printed as
// file:line name. It exits 1 when git cannot list the files.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"sort"
	"strings"
)

func main() {
	top := flag.Int("top", 15, "how many of the largest files to print")
	list := flag.Bool("list", false, "print every undocumented exported identifier")
	flag.Parse()

	out, err := exec.Command("git", "ls-files").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "housekeeping: git ls-files:", err)
		os.Exit(1)
	}
	type sized struct {
		path  string
		lines int
	}
	var files []sized
	var undoc []string
	fset := token.NewFileSet()
	for _, p := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.Contains(p, "/testdata/") || strings.HasSuffix(p, ".pb.go") {
			continue
		}
		if !strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, ".lua") && !strings.HasSuffix(p, ".sh") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		files = append(files, sized{p, bytes.Count(b, []byte("\n"))})
		if strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			undoc = append(undoc, undocumented(fset, p, b)...)
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].lines > files[j].lines })
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	fmt.Fprintf(w, "largest files (lines):\n")
	for i := 0; i < *top && i < len(files); i++ {
		fmt.Fprintf(w, "  %5d  %s\n", files[i].lines, files[i].path)
	}
	fmt.Fprintf(w, "exported identifiers without a doc comment (non-test Go): %d\n", len(undoc))
	if *list {
		for _, u := range undoc {
			fmt.Fprintf(w, "  %s\n", u)
		}
	}
}

// undocumented returns file:line name for each exported top-level
// identifier, method of an exported type, and exported struct field or
// interface method without a doc comment. A name in a grouped const/var
// block counts as documented when the group has a doc comment.
func undocumented(fset *token.FileSet, path string, src []byte) []string {
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return nil
	}
	var res []string
	add := func(pos token.Pos, name string) {
		res = append(res, fmt.Sprintf("%s:%d %s", path, fset.Position(pos).Line, name))
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Doc != nil {
				continue
			}
			if d.Recv != nil && len(d.Recv.List) > 0 {
				if !exportedRecv(d.Recv.List[0].Type) {
					continue
				}
			}
			add(d.Pos(), d.Name.Name)
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					if s.Doc == nil && d.Doc == nil {
						add(s.Pos(), s.Name.Name)
					}
					fields(s, add)
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() && s.Doc == nil && d.Doc == nil && s.Comment == nil {
							add(n.Pos(), n.Name)
						}
					}
				}
			}
		}
	}
	return res
}

func fields(s *ast.TypeSpec, add func(token.Pos, string)) {
	var list *ast.FieldList
	switch t := s.Type.(type) {
	case *ast.StructType:
		list = t.Fields
	case *ast.InterfaceType:
		list = t.Methods
	}
	if list == nil {
		return
	}
	for _, fl := range list.List {
		if fl.Doc != nil || fl.Comment != nil {
			continue
		}
		for _, n := range fl.Names {
			if n.IsExported() {
				add(n.Pos(), s.Name.Name+"."+n.Name)
			}
		}
	}
}

func exportedRecv(e ast.Expr) bool {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.Ident:
			return t.IsExported()
		default:
			return false
		}
	}
}

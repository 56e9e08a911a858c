// Package doccheck finds exported Go identifiers that have no doc comment.
//
// It is shared by scripts/housekeeping (which prints the count a
// maintainer watches) and internal/archtest (whose
// TestExportedIdentifiersDocumented fails on any finding). What counts:
// an exported top-level function, type, constant or variable; a method
// whose receiver's type is exported; an exported field of a struct type
// or method of an interface type. A name in a grouped const, var or type
// block is documented when the group has a doc comment; a field, constant
// or variable is also documented by a trailing line comment. Test files
// and generated files (a "// Code generated ... DO NOT EDIT." line) are
// not checked.
package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Finding is one exported identifier without a doc comment.
type Finding struct {
	// Pos is where the identifier is declared: Filename as given to File
	// (or joined by Dir), Line and Column 1-based.
	Pos token.Position
	// Name is the identifier, qualified by its type for a method, field
	// or interface method ("Options.Timeout").
	Name string
}

// String returns "file:line name", the form scripts/housekeeping prints.
func (f Finding) String() string {
	return fmt.Sprintf("%s:%d %s", f.Pos.Filename, f.Pos.Line, f.Name)
}

// File returns the findings of one Go source file, in source order. path
// names the file in the findings; src is its content. A generated file
// gives none. The error is the parser's, for a file that does not parse.
func File(fset *token.FileSet, path string, src []byte) ([]Finding, error) {
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	if ast.IsGenerated(f) {
		return nil, nil
	}
	var res []Finding
	add := func(pos token.Pos, name string) {
		res = append(res, Finding{Pos: fset.Position(pos), Name: name})
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Doc != nil {
				continue
			}
			name := d.Name.Name
			if d.Recv != nil && len(d.Recv.List) > 0 {
				recv := Receiver(d.Recv.List[0].Type)
				if !token.IsExported(recv) {
					continue
				}
				name = recv + "." + name
			}
			add(d.Pos(), name)
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
					members(s, add)
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
	return res, nil
}

// Dir returns the findings of the non-test .go files directly in dir (one
// package), sorted by file and line. Filenames are dir joined with the
// file's name. The error is the first read or parse failure.
func Dir(dir string) ([]Finding, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var res []Finding
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		p := filepath.Join(dir, n)
		src, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		fs, err := File(fset, p, src)
		if err != nil {
			return nil, err
		}
		res = append(res, fs...)
	}
	sort.SliceStable(res, func(i, j int) bool {
		if res[i].Pos.Filename != res[j].Pos.Filename {
			return res[i].Pos.Filename < res[j].Pos.Filename
		}
		return res[i].Pos.Line < res[j].Pos.Line
	})
	return res, nil
}

// members adds the undocumented exported fields of a struct type and
// methods of an interface type, as Type.Name.
func members(s *ast.TypeSpec, add func(token.Pos, string)) {
	list := Members(s)
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

// Members returns the fields of a struct type or the methods of an
// interface type; nil for any other type.
func Members(s *ast.TypeSpec) *ast.FieldList {
	switch t := s.Type.(type) {
	case *ast.StructType:
		return t.Fields
	case *ast.InterfaceType:
		return t.Methods
	}
	return nil
}

// Receiver returns the name of a method receiver's base type, through
// pointers and type parameters (*T, T[K], *T[K, V] give "T"); "" when e
// is not such a receiver expression.
func Receiver(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}

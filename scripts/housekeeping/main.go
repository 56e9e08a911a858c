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
// -list, every undocumented exported identifier (as package
// internal/doccheck defines it) is printed as file:line name. A Go file
// that does not parse is reported on standard error and skipped. It exits
// 1 when git cannot list the files or standard output cannot be written.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"go/token"
	"os"
	"os/exec"
	"sort"
	"strings"

	"github.com/ratelimitd/ratelimitd/internal/doccheck"
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
	var undoc []doccheck.Finding
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
			fs, err := doccheck.File(fset, p, b)
			if err != nil {
				fmt.Fprintln(os.Stderr, "housekeeping:", err)
			}
			undoc = append(undoc, fs...)
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].lines > files[j].lines })
	w := bufio.NewWriter(os.Stdout)
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
	if err := w.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "housekeeping:", err)
		os.Exit(1)
	}
}

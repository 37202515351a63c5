package outbox_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// docProgram is a ```go block of a Markdown file that is a whole program.
type docProgram struct {
	file string // the Markdown file, relative to the module root
	line int    // line of the block's opening fence
	code string
}

// docPrograms returns the ```go blocks of the files that start with "package main"; other
// blocks are fragments and are not compiled.
func docPrograms(t *testing.T, files []string) []docProgram {
	t.Helper()
	var out []docProgram
	for _, file := range files {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		var (
			in    bool
			start int
			block strings.Builder
		)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			trimmed := strings.TrimSpace(line)
			switch {
			case !in && trimmed == "```go":
				in, start = true, n
				block.Reset()
			case in && trimmed == "```":
				in = false
				if code := block.String(); strings.HasPrefix(strings.TrimSpace(code), "package main") {
					out = append(out, docProgram{file: file, line: start, code: code})
				}
			case in:
				block.WriteString(line)
				block.WriteByte('\n')
			}
		}
		_ = f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		if in {
			t.Errorf("%s:%d: unterminated code block", file, start)
		}
	}
	return out
}

// TestDocsProgramsCompile builds and vets every whole program (a ```go block starting with
// "package main") of README.md and docs/**/*.md against this module, so the documentation
// cannot drift from the API. Each program is written into a temporary directory inside the
// module tree (its name starts with '_', so ./... patterns never see it) and removed after.
func TestDocsProgramsCompile(t *testing.T) {
	files := []string{"README.md"}
	err := filepath.WalkDir("docs", func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	progs := docPrograms(t, files)
	if len(progs) == 0 {
		t.Fatal("no whole program found in README.md and docs/: the README quick start must be one")
	}
	readme := false
	for _, p := range progs {
		readme = readme || p.file == "README.md"
	}
	if !readme {
		t.Error("README.md has no whole program (a ```go block starting with package main)")
	}

	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Fatal("no go command to build the documentation's programs:", err)
		}
	}
	dir, err := os.MkdirTemp(".", "_docstest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	args := []string{"vet"}
	where := map[string]docProgram{}
	for i, p := range progs {
		sub := filepath.Join(dir, fmt.Sprintf("p%d", i))
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sub, "main.go"), []byte(p.code), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "./"+filepath.ToSlash(sub))
		where[filepath.Base(sub)] = p
	}
	cmd := exec.Command(goBin, args...) // go vet type-checks (builds) each program, then vets it
	out, err := cmd.CombinedOutput()
	if err != nil {
		// Point each failing program at its place in the Markdown.
		msg := string(out)
		for name, p := range where {
			msg = strings.ReplaceAll(msg, filepath.Join(filepath.Base(dir), name)+string(filepath.Separator)+"main.go",
				fmt.Sprintf("%s (block at line %d)", p.file, p.line))
		}
		t.Fatalf("go vet of the documentation's programs: %v\n%s", err, msg)
	}
	t.Logf("%d programs compiled and vetted", len(progs))
}

package outbox_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"unicode"
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
	progs := docPrograms(t, docFiles(t))
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

	goBin := goCommand(t)
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

// goCommand returns the go command of the toolchain running the test (else the one on PATH).
func goCommand(t *testing.T) string {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Fatal("no go command:", err)
		}
	}
	return goBin
}

// docFiles returns README.md and every Markdown file below docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
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
	return files
}

var (
	mdFence   = regexp.MustCompile("(?s)```.*?```")
	mdHeading = regexp.MustCompile(`(?m)^#+ (.*)$`)
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
)

// headingAnchor is the anchor GitHub gives a Markdown heading: lower case, punctuation other
// than '-' and '_' dropped, spaces as '-'.
func headingAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocsLinks checks every relative link of README.md and docs/**/*.md: the file it names
// exists, and so does the heading its #anchor names.
func TestDocsLinks(t *testing.T) {
	files := docFiles(t)
	anchors := map[string]map[string]bool{}
	text := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text[f] = string(b)
		anchors[f] = map[string]bool{}
		for _, m := range mdHeading.FindAllStringSubmatch(mdFence.ReplaceAllString(string(b), ""), -1) {
			anchors[f][headingAnchor(m[1])] = true
		}
	}
	links := 0
	for _, f := range files {
		for _, m := range mdLink.FindAllStringSubmatch(mdFence.ReplaceAllString(text[f], ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			path, anchor, _ := strings.Cut(target, "#")
			file := f
			if path != "" {
				file = filepath.Clean(filepath.Join(filepath.Dir(f), path))
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: link %q: %v", f, target, err)
					continue
				}
			}
			if anchor != "" && (anchors[file] == nil || !anchors[file][anchor]) {
				t.Errorf("%s: link %q: no heading with anchor %q in %s", f, target, anchor, file)
			}
		}
	}
	if links == 0 {
		t.Fatal("no relative links found: the README links the pages of docs/")
	}
}

package main

import (
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersion: `outbox version` and `outbox --version` print the same line: the module
// version, the VCS commit and the Go version (the test binary is built without VCS stamping,
// so the commit is unknown and the version "(devel)").
func TestVersion(t *testing.T) {
	want := regexp.MustCompile(`^outbox \(devel\) \(commit unknown, go1\.\d+(\.\d+)?\S*\)\n$`)
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if out := mustRun(t, nil, args...); !want.MatchString(out) {
			t.Errorf("outbox %s printed %q", strings.Join(args, " "), out)
		}
	}
	wantStderr(t, cli(t, nil, "version", "x"), 2, `outbox: unexpected argument "x": outbox version takes none`)
}

// TestBuildInfoOf: the commit is vcs.revision, marked +modified for a dirty work tree; a
// release version is shown as recorded.
func TestBuildInfoOf(t *testing.T) {
	for _, tc := range []struct {
		bi   *debug.BuildInfo
		want string
	}{
		{&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "ef1c068382e2b5ab42af42a987b04bf6c1b1b9cd"}, {Key: "vcs.modified", Value: "true"}}},
			"outbox (devel) (commit ef1c068382e2b5ab42af42a987b04bf6c1b1b9cd+modified, go1.26.0)"},
		{&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.0"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "false"}}},
			"outbox v1.4.0 (commit abc, go1.26.0)"},
		{&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.0"}}, "outbox v1.4.0 (commit unknown, go1.26.0)"},
	} {
		if got := buildInfoOf(tc.bi).String(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}

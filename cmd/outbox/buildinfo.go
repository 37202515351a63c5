package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
)

// buildInfo is what the binary knows of its own build (runtime/debug.ReadBuildInfo).
type buildInfo struct {
	// version is the module version: a release ("v1.2.3"), a pseudo-version, or "(devel)"
	// for a binary built from a checkout.
	version string
	// commit is the VCS revision the binary was built from, with "+modified" when the work
	// tree had uncommitted changes; "unknown" when the build recorded none (go build
	// -buildvcs=false, go install of a module version, go run).
	commit string
	// goVersion is the Go release that built the binary ("go1.26.0").
	goVersion string
}

// readBuildInfo returns the running binary's build information.
func readBuildInfo() buildInfo {
	bi, _ := debug.ReadBuildInfo()
	return buildInfoOf(bi)
}

// buildInfoOf extracts a buildInfo from bi (nil: nothing recorded).
func buildInfoOf(bi *debug.BuildInfo) buildInfo {
	b := buildInfo{version: "(devel)", commit: "unknown", goVersion: runtime.Version()}
	if bi == nil {
		return b
	}
	if bi.Main.Version != "" {
		b.version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		b.goVersion = bi.GoVersion
	}
	var revision string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if revision != "" {
		b.commit = revision
		if modified {
			b.commit += "+modified"
		}
	}
	return b
}

// String is the line `outbox version` prints.
func (b buildInfo) String() string {
	return fmt.Sprintf("outbox %s (commit %s, %s)", b.version, b.commit, b.goVersion)
}

// collector is the outbox_build_info gauge: always 1, labelled with the build.
func (b buildInfo) collector() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "outbox_build_info",
		Help:        "Always 1; the labels name the outbox binary's module version, VCS commit and Go version.",
		ConstLabels: prometheus.Labels{"version": b.version, "commit": b.commit, "goversion": b.goVersion},
	})
	g.Set(1)
	return g
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the module version, VCS commit and Go version of this binary",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &usageError{fmt.Errorf("unexpected argument %q: outbox version takes none", args[0])}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), readBuildInfo())
			return err
		},
	}
}

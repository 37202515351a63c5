package doctor

import (
	"errors"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg   Config
		field string // "" = valid
	}{
		{Config{}, ""},
		{Config{OldTxWarn: time.Second, OldTxFail: time.Minute, Wakeup: WakeListen, ProbeTimeout: time.Second}, ""},
		{Config{OldTxWarn: -1}, "doctor.Config.OldTxWarn"},
		{Config{OldTxFail: -1}, "doctor.Config.OldTxFail"},
		{Config{OldTxWarn: time.Hour, OldTxFail: time.Minute}, "doctor.Config.OldTxFail"},
		{Config{ProbeTimeout: -1}, "doctor.Config.ProbeTimeout"},
		{Config{Wakeup: "nope"}, "doctor.Config.Wakeup"},
		{Config{Schema: outbox.SchemaConfig{Table: "a.b.c"}}, "SchemaConfig.Table"},
	} {
		err := tc.cfg.Validate()
		var ce *outbox.ConfigError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%+v: %v", tc.cfg, err)
		case tc.field != "" && (!errors.As(err, &ce) || ce.Field != tc.field):
			t.Errorf("%+v: error %v, want a ConfigError on %s", tc.cfg, err, tc.field)
		}
	}
}

func TestDefaultsKeepFailAboveWarn(t *testing.T) {
	c := Config{OldTxWarn: time.Hour}
	c.setDefaults()
	if c.OldTxFail != time.Hour || c.grade(59*time.Minute) != OK || c.grade(time.Hour) != Fail {
		t.Fatalf("OldTxWarn 1h: OldTxFail %s", c.OldTxFail)
	}
	c = Config{}
	c.setDefaults()
	for age, want := range map[time.Duration]Verdict{59 * time.Second: OK, time.Minute: Warn, 10 * time.Minute: Fail} {
		if got := c.grade(age); got != want {
			t.Errorf("grade(%s) = %s, want %s", age, got, want)
		}
	}
}

func TestAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v                   string
		major, minor, patch int
		want                bool
	}{
		{"3.45.1", 3, 42, 0, true},
		{"3.41.9", 3, 42, 0, false},
		{"10.11.6-MariaDB-0+deb12u1", 10, 6, 0, true},
		{"10.5.23-MariaDB", 10, 6, 0, false},
		{"8.0.23", 8, 0, 23, true},
		{"8.0.22-log", 8, 0, 23, false},
		{"8.4", 8, 0, 23, true},
	} {
		if got := atLeast(tc.v, tc.major, tc.minor, tc.patch); got != tc.want {
			t.Errorf("atLeast(%q, %d.%d.%d) = %t", tc.v, tc.major, tc.minor, tc.patch, got)
		}
	}
}

func TestWantIndexesFollowSchemaSQL(t *testing.T) {
	got, err := wantIndexes(outbox.SchemaConfig{Table: "app.events"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"events_keyed_idx", "events_unordered_idx", "events_key_idx", "events_idempotency_key_idx", "events_published_idx", "events_dead_idx", "events_retry_idx", "events_blocking_idx"}
	if len(got) != len(want) {
		t.Fatalf("indexes %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("indexes %q, want %q", got, want)
		}
	}
}

package outbox_test

import (
	"errors"
	"testing"

	"github.com/watermill-outbox/outbox"
)

func TestTopicPattern(t *testing.T) {
	cases := []struct {
		pattern, topic string
		match          bool
		exact          bool
	}{
		{"a_b", "a_b", true, true},
		{"a_b", "axb", false, true},
		{"a%c", "abc", false, true},
		{"lib.*", "lib.x", true, false},
		{"lib.*", "libz", false, false},
		{"*", "anything", true, false},
	}
	for _, c := range cases {
		p, err := outbox.ParseTopicPattern(c.pattern)
		if err != nil {
			t.Fatal(err)
		}
		_, exact := p.Exact()
		if p.Match(c.topic) != c.match || exact != c.exact {
			t.Errorf("%q on %q: match %v exact %v", c.pattern, c.topic, p.Match(c.topic), exact)
		}
	}
	for _, bad := range []string{"", "a*b", "a?", "*x"} {
		if _, err := outbox.ParseTopicPattern(bad); !errors.Is(err, outbox.ErrConfig) {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
	if (outbox.TopicPattern{}).Match("x") {
		t.Error("zero TopicPattern matched")
	}
}

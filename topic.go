package outbox

import (
	"fmt"
	"github.com/watermill-outbox/outbox/internal/dialect"
	"strings"
)

// topicFilter is a compiled topic pattern: an exact name, a prefix pattern ending in '*'
// ("library.*"), or "*" for every topic. '_' and '%' are ordinary characters.
type topicFilter struct {
	all    bool
	exact  string
	prefix string
	isPfx  bool
}

// parseTopicPattern compiles pattern, or returns a *ConfigError naming field.
func parseTopicPattern(field, pattern string) (topicFilter, error) {
	switch {
	case pattern == "":
		return topicFilter{}, &ConfigError{Field: field, Reason: "empty topic pattern"}
	case pattern == "*":
		return topicFilter{all: true}, nil
	case strings.ContainsRune(pattern, '?'):
		return topicFilter{}, &ConfigError{Field: field, Reason: fmt.Sprintf("%q: '?' is not supported", pattern)}
	}
	star := strings.IndexByte(pattern, '*')
	if star >= 0 && star != len(pattern)-1 {
		return topicFilter{}, &ConfigError{Field: field, Reason: fmt.Sprintf("%q: '*' is allowed only at the end", pattern)}
	}
	if reason := checkText(strings.TrimSuffix(pattern, "*")); reason != "" {
		return topicFilter{}, &ConfigError{Field: field, Reason: fmt.Sprintf("%q: %s", pattern, reason)}
	}
	if star >= 0 {
		return topicFilter{isPfx: true, prefix: pattern[:star]}, nil
	}
	return topicFilter{exact: pattern}, nil
}

// dialect returns the filter in the dialect layer's terms.
func (f topicFilter) dialect() dialect.Topic {
	switch {
	case f.all:
		return dialect.Topic{All: true}
	case f.isPfx:
		return dialect.Topic{Prefix: true, Value: f.prefix}
	}
	return dialect.Topic{Value: f.exact}
}

// Match reports whether topic is selected by the filter.
func (f topicFilter) match(topic string) bool {
	switch {
	case f.all:
		return true
	case f.isPfx:
		return strings.HasPrefix(topic, f.prefix)
	default:
		return topic == f.exact
	}
}

// topicSelection is a subscription's include pattern minus the excluded patterns.
type topicSelection struct {
	include  topicFilter
	excludes []topicFilter
}

// dialect returns the selection in the dialect layer's terms.
func (s topicSelection) dialect() dialect.TopicSelection {
	out := dialect.TopicSelection{Include: s.include.dialect()}
	for _, e := range s.excludes {
		out.Excludes = append(out.Excludes, e.dialect())
	}
	return out
}

func (s topicSelection) match(topic string) bool {
	if !s.include.match(topic) {
		return false
	}
	for _, e := range s.excludes {
		if e.match(topic) {
			return false
		}
	}
	return true
}

// TopicPattern is a compiled topic pattern as Subscribe, ExcludeTopics and RetryFilter take
// them: an exact name, a prefix pattern ending in '*' ("library.*"), or "*" for every topic;
// '_' and '%' are ordinary characters. The zero value matches nothing. Safe for concurrent use.
type TopicPattern struct {
	f     topicFilter
	valid bool
}

// ParseTopicPattern compiles pattern. Errors: a *ConfigError (Field "topic") for an empty
// pattern, a '?', a '*' anywhere but at the end, invalid UTF-8, a NUL or more than
// MaxTextLength characters.
func ParseTopicPattern(pattern string) (TopicPattern, error) {
	f, err := parseTopicPattern("topic", pattern)
	if err != nil {
		return TopicPattern{}, err
	}
	return TopicPattern{f: f, valid: true}, nil
}

// Match reports whether topic is selected by the pattern.
func (p TopicPattern) Match(topic string) bool { return p.valid && p.f.match(topic) }

// Exact returns the topic and true when the pattern names one topic (no '*').
func (p TopicPattern) Exact() (string, bool) {
	if !p.valid || p.f.all || p.f.isPfx {
		return "", false
	}
	return p.f.exact, true
}

package main

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// servingLine is the relay's log line that names its --http-addr.
var servingLine = regexp.MustCompile(`msg="outbox relay serving /metrics, /healthz and /readyz" http-addr=(127\.0\.0\.1:\d+)`)

// httpBase waits for the relay p's serving line and returns "http://host:port".
func httpBase(t *testing.T, p *process) string {
	t.Helper()
	var base string
	waitFor(t, 30*time.Second, "the serving line", func() bool {
		if m := servingLine.FindStringSubmatch(p.errb.String()); m != nil {
			base = "http://" + m[1]
			return true
		}
		return !p.running()
	})
	if base == "" {
		t.Fatalf("relay exited: %s", p.errb.String())
	}
	return base
}

// httpGet returns the status code and body of a GET of url.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// metricOf returns the value of series (name with labels, as exposed) in a /metrics body, or
// -1 when it is absent.
func metricOf(body, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

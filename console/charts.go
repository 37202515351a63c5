package console

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox"
)

// The charts are inline SVG: one bar per minute of the last hour, scaled to the hour's
// largest value, with a title per bar (shown on hover) and the scale written beside.
const (
	chartW, chartH = 600, 100
	minutes        = 60
)

// rateChart draws the events delivered per minute.
func rateChart(st outbox.DeliveryStats) template.HTML {
	return barChart(st, "delivered per minute", func(m outbox.MinuteStats) (float64, string) {
		return float64(m.Delivered), fmt.Sprintf("%s delivered (%.1f/s)", num(m.Delivered), float64(m.Delivered)/60)
	}, func(v float64) string { return num(int64(v)) + "/min" })
}

// delayChart draws the commit → delivery delay's 95th percentile per minute.
func delayChart(st outbox.DeliveryStats) template.HTML {
	return barChart(st, "commit to delivery delay, p95", func(m outbox.MinuteStats) (float64, string) {
		return m.P95Delay.Seconds(), fmt.Sprintf("p95 %s, mean %s, max %s", ago(m.P95Delay), ago(m.MeanDelay), ago(m.MaxDelay))
	}, func(v float64) string { return ago(time.Duration(v * float64(time.Second))) })
}

func barChart(st outbox.DeliveryStats, label string, val func(outbox.MinuteStats) (float64, string), scale func(float64) string) template.HTML {
	end := st.Now.Truncate(time.Minute)
	top := 0.0
	for _, m := range st.Minutes {
		v, _ := val(m)
		top = max(top, v)
	}
	if top == 0 {
		top = 1
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="%s" preserveAspectRatio="none">`, chartW, chartH+14, template.HTMLEscapeString(label))
	fmt.Fprintf(&b, `<line x1="0" y1="%d" x2="%d" y2="%d" class="axis"/>`, chartH, chartW, chartH)
	bw := float64(chartW) / minutes
	for _, m := range st.Minutes {
		i := minutes - 1 - int(end.Sub(m.Minute)/time.Minute)
		if i < 0 || i >= minutes {
			continue
		}
		v, title := val(m)
		h := v / top * (chartH - 4)
		if v > 0 && h < 1 {
			h = 1
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s %s</title></rect>`,
			float64(i)*bw+1, chartH-h, bw-2, h, m.Minute.UTC().Format("15:04"), template.HTMLEscapeString(title))
	}
	fmt.Fprintf(&b, `<text x="2" y="%d">-60 min</text><text x="%d" y="%d" text-anchor="end">now</text>`, chartH+12, chartW-2, chartH+12)
	fmt.Fprintf(&b, `<text x="2" y="10">%s</text>`, template.HTMLEscapeString(scale(top)))
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

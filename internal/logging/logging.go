// Package logging builds the process logger of `ratelimitd serve` from
// --log-level and --log-format.
package logging

import (
	"io"
	"log/slog"
)

// New returns a logger writing to w at level ("debug", "info", "warn" or
// "error", any case; anything else is info) as JSON when format is "json",
// else as text. Durations print as Go duration strings ("10ms", "1m30s")
// in both formats: the JSON handler alone would print nanoseconds
// (10000000).
func New(level, format string, w io.Writer) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level)) // validated with the flags
	ho := &slog.HandlerOptions{Level: l, ReplaceAttr: durationString}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}

// durationString is the loggers' slog.HandlerOptions.ReplaceAttr: an
// attribute of kind slog.KindDuration becomes its time.Duration.String()
// ("10ms"); every other attribute is returned unchanged.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

package serveopts

import (
	"fmt"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// The decision log's flags. The admin API is served on the debug listener
// (listen.Debug), the operational events are internal/events'.

// validateDecisionLog checks --log-decisions and --log-decisions-rate.
func (o Options) validateDecisionLog() error {
	if _, err := service.ParseDecisionLogMode(o.LogDecisions); err != nil {
		return fmt.Errorf("--log-decisions=%s: want off, denied or all", o.LogDecisions)
	}
	if !(o.Service.DecisionLogRate > 0) {
		// 0 would be service's default: the flag's rule is stated here.
		return fmt.Errorf("--log-decisions-rate=%v: must be > 0 (lines per second)", o.Service.DecisionLogRate)
	}
	return nil
}

// decisionLog maps the flags onto service.Options (validated).
func decisionLog(o Options) (service.DecisionLogMode, float64, bool) {
	m, _ := service.ParseDecisionLogMode(o.LogDecisions)
	return m, o.Service.DecisionLogRate, o.KeyValues == "clear"
}

// WithDecisionLog returns so with the decision log options of o.
func WithDecisionLog(so service.Options, o Options) service.Options {
	so.DecisionLog, so.DecisionLogRate, so.LogValues = decisionLog(o)
	return so
}

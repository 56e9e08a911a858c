package serveopts

import (
	"io"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// TestDecisionLogFlags: --log-decisions and --log-decisions-rate, with
// their twins.
func TestDecisionLogFlags(t *testing.T) {
	d, _, err := Parse(nil, env(), io.Discard)
	if err != nil || d.LogDecisions != "off" || d.Service.DecisionLogRate != service.DefaultDecisionLogRate {
		t.Fatalf("defaults %q %v, %v", d.LogDecisions, d.Service.DecisionLogRate, err)
	}
	o, _, err := Parse([]string{"--log-decisions=Denied", "--log-decisions-rate=2.5", "--key-values=clear"}, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	m, rate, values := decisionLog(o)
	if m != service.DecisionLogDenied || rate != 2.5 || !values {
		t.Errorf("flags: %v %v %v", m, rate, values)
	}
	e, _, err := Parse(nil, env("RATELIMITD_LOG_DECISIONS", "all", "RATELIMITD_LOG_DECISIONS_RATE", "9"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if m, rate, values := decisionLog(e); m != service.DecisionLogAll || rate != 9 || values {
		t.Errorf("twins: %v %v %v", m, rate, values)
	}
	for _, bad := range [][]string{{"--log-decisions=some"}, {"--log-decisions-rate=0"}, {"--log-decisions-rate=-1"}} {
		if _, _, err := Parse(bad, env(), io.Discard); err == nil || !strings.Contains(err.Error(), strings.SplitN(bad[0], "=", 2)[0]) {
			t.Errorf("%v: err %v", bad, err)
		}
	}
}

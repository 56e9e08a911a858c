package k8s_test

import (
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/deploytest"
)

func TestMain(m *testing.M) { deploytest.Main(m) }

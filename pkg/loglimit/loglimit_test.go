package loglimit

import (
	"testing"
	"time"
)

func TestAllow(t *testing.T) {
	l := New(time.Second)
	t0 := time.Unix(1000, 0)
	if ok, n := l.Allow("a", t0); !ok || n != 0 {
		t.Fatalf("first line: %v %d, want true 0", ok, n)
	}
	for i := range 3 {
		if ok, _ := l.Allow("a", t0.Add(time.Duration(i)*100*time.Millisecond)); ok {
			t.Fatalf("line %d within the interval let through", i)
		}
	}
	if ok, n := l.Allow("b", t0); !ok || n != 0 {
		t.Fatalf("another key: %v %d, want true 0", ok, n)
	}
	if ok, n := l.Allow("a", t0.Add(time.Second)); !ok || n != 3 {
		t.Fatalf("after the interval: %v %d, want true 3 suppressed", ok, n)
	}
}

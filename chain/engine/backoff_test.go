package engine

import (
	"testing"
	"time"

	"github.com/chaingate/gateway/chain"
)

func TestBackoff(t *testing.T) {
	tests := []struct {
		name    string
		retry   chain.Retry
		attempt int
		want    time.Duration
	}{
		{"fixed", chain.Retry{Strategy: chain.BackoffFixed, BackoffMS: 200}, 5, 200 * time.Millisecond},
		{"linear", chain.Retry{Strategy: chain.BackoffLinear, BackoffMS: 200}, 3, 600 * time.Millisecond},
		{"exponential", chain.Retry{Strategy: chain.BackoffExponential, BackoffMS: 100}, 4, 800 * time.Millisecond},
		{"capped", chain.Retry{Strategy: chain.BackoffExponential, BackoffMS: 100, MaxBackoffMS: 500}, 4, 500 * time.Millisecond},
		{"exponential past int64 stays capped", chain.Retry{Strategy: chain.BackoffExponential, BackoffMS: 10000, MaxBackoffMS: 300000}, 31, 300 * time.Second},
		{"far past int64", chain.Retry{Strategy: chain.BackoffExponential, BackoffMS: 10000, MaxBackoffMS: 300000}, 200, 300 * time.Second},
		{"linear past int64", chain.Retry{Strategy: chain.BackoffLinear, BackoffMS: 1 << 40, MaxBackoffMS: 1000}, 1 << 30, time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := backoff(&tc.retry, tc.attempt); got != tc.want {
				t.Errorf("backoff(%d) = %v, want %v", tc.attempt, got, tc.want)
			}
		})
	}
}

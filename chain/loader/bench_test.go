package loader_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/loader"
)

// BenchmarkLoadLongLine loads a stored-definition shape: the TOML encoder
// writes arrays inline, so one line may hold thousands of elements, each
// of which gets a position.
func BenchmarkLoadLongLine(b *testing.B) {
	for _, n := range []int{1000, 10000, 40000} {
		src := []byte("[gateway]\nauth = { tokens = [" + strings.Repeat(`"é-token",`, n) + `"last"] }` + "\n")
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				if _, err := loader.LoadBytes("long.toml", src, loader.Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

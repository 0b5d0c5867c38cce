package show

import (
	"fmt"

	"github.com/chaingate/gateway/internal/textx"
)

// ByteSize is n bytes as people read sizes: 3.2 MB.
func ByteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KB", float64(n)/(1<<10))
	}
	return textx.Count(int(n), "byte", "bytes")
}

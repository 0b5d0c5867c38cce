//go:build !unix

package exec

import (
	"context"

	"github.com/chaingate/gateway/providers"
)

// run refuses: stopping a command with all it started needs process
// groups.
func run(context.Context, job) (int, string, error) {
	return 0, "", providers.Permanent("unsupported", "the exec provider runs commands on Unix only")
}

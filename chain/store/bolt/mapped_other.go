//go:build !linux

package bolt

import bbolt "go.etcd.io/bbolt"

// initialMmapSize is left to bbolt where growing the mapping may grow the
// file with it.
func initialMmapSize() int { return 0 }

// releaseMapping does nothing where dropping a shared mapping's pages is
// only advice.
func releaseMapping(*bbolt.Tx) {}

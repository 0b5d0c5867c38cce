package main

import (
	"bytes"
	"fmt"
	"os"

	"go.etcd.io/bbolt"
)

func main() {
	db, err := bbolt.Open(os.Args[1], 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		panic(err)
	}
	_ = db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			st := b.Stats()
			fmt.Printf("bucket %s: keys %d, leaf pages %d (%d bytes in use of %d), branch %d, overflow %d\n", name, st.KeyN, st.LeafPageN, st.LeafInuse, st.LeafAlloc, st.BranchPageN, st.LeafOverflowN)
			kinds := map[string][2]int{}
			n := 0
			_ = b.ForEach(func(k, v []byte) error {
				i := bytes.IndexByte(k, 0)
				kind := "?"
				if i >= 0 && i+1 < len(k) {
					kind = string(k[i+1])
					rest := k[i+2:]
					if bytes.IndexByte(rest, '[') >= 0 {
						if bytes.IndexByte(rest, '/') >= 0 {
							kind += "-initem"
						} else {
							kind += "-slot"
						}
					}
				}
				c := kinds[kind]
				c[0]++
				c[1] += len(k) + len(v)
				kinds[kind] = c
				if n < 3 && kind == "s-slot" {
					fmt.Printf("  sample %q = %s\n", k, v)
					n++
				}
				return nil
			})
			for k, c := range kinds {
				fmt.Printf("  kind %s: %d records, %d bytes (%.0f each)\n", k, c[0], c[1], float64(c[1])/float64(c[0]))
			}
			return nil
		})
	})
	info := db.Stats()
	fmt.Printf("free pages %d pending %d free alloc %d\n", info.FreePageN, info.PendingPageN, info.FreeAlloc)
}

package engine

// bitset marks item indexes; a million items take 125 KiB.
type bitset struct{ words []uint64 }

func (b *bitset) set(i int) {
	for len(b.words) <= i/64 {
		b.words = append(b.words, 0)
	}
	b.words[i/64] |= 1 << (i % 64)
}

func (b *bitset) has(i int) bool {
	return b != nil && i/64 < len(b.words) && b.words[i/64]&(1<<(i%64)) != 0
}

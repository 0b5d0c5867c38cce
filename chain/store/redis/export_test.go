package redis

// SetBigKey sets how many elements a key may hold and still be copied in
// one read, so that a test reaches the paged copy with a small store; the
// returned function sets it back.
func SetBigKey(n int) func() {
	old := bigKey
	bigKey = n
	return func() { bigKey = old }
}

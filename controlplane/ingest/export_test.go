package ingest

// BetweenChunks sets a hook run between a flush's transactions.
func BetweenChunks(in *Ingester, f func()) { in.betweenChunks = f }

// Unlocked reports whether the lock of id's pending state is free now (true
// when it has none).
func Unlocked(in *Ingester, id string) bool {
	c := in.cell(id)
	if c == nil {
		return true
	}
	if !c.mu.TryLock() {
		return false
	}
	c.mu.Unlock()
	return true
}

// Cells is how many workers have pending state kept.
func Cells(in *Ingester) int {
	n := 0
	in.cells.Range(func(string, *cell) bool { n++; return true })
	return n
}

// Superseded returns the mark of id's entry in the running flush
// transaction (nil: none). Call it from inside that transaction (a Rider's
// Take), where nothing writes the cells' entries.
func Superseded(in *Ingester, id string) func() bool {
	c := in.cell(id)
	if c == nil || c.inflight == nil {
		return nil
	}
	return c.inflight.superseded.Load
}

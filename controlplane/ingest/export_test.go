package ingest

// BetweenChunks sets a hook run between a flush's transactions.
func BetweenChunks(in *Ingester, f func()) { in.betweenChunks = f }

// Unlocked reports whether the ingester's lock is free now.
func Unlocked(in *Ingester) bool {
	if !in.mu.TryLock() {
		return false
	}
	in.mu.Unlock()
	return true
}

// Superseded returns the mark of id's entry in the running flush
// transaction (nil: none). Call it from inside that transaction (a Rider's
// Take), where nothing writes the entries.
func Superseded(in *Ingester, id string) func() bool {
	e := in.inflight[id]
	if e == nil {
		return nil
	}
	return e.superseded.Load
}

package ingest

// BetweenChunks sets a hook run between a flush's transactions.
func BetweenChunks(in *Ingester, f func()) { in.betweenChunks = f }

package sqlitewal

// SetVersionFunc makes w read the database's data_version from f instead of SQLite (tests).
func SetVersionFunc(w *Watcher, f func() (int64, bool)) { w.versionFn.Store(&f) }

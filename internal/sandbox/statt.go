package sandbox

import (
	"io/fs"
	"syscall"
)

type blockStat struct {
	Ino    uint64
	Nlink  uint64
	Blocks int64
}

func statT(info fs.FileInfo) (blockStat, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return blockStat{}, false
	}
	return blockStat{Ino: st.Ino, Nlink: uint64(st.Nlink), Blocks: st.Blocks}, true
}

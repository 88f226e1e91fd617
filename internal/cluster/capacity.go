package cluster

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
)

// hostCapacity reads the host's memory (/proc/meminfo) and CPU count.
func hostCapacity() (Capacity, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return Capacity{}, fmt.Errorf("capacity: %w", err)
	}
	c := Capacity{CPUs: goruntime.NumCPU()}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			c.MemoryTotalBytes = kb << 10
		case "MemAvailable:":
			c.MemoryFreeBytes = kb << 10
		}
	}
	if c.MemoryTotalBytes == 0 {
		return c, fmt.Errorf("capacity: no MemTotal in /proc/meminfo")
	}
	return c, nil
}

// cpuSampler measures the host's idle CPU fraction between two samples
// (the aggregate "cpu" line of /proc/stat: idle + iowait over all).
type cpuSampler struct {
	mu          sync.Mutex
	idle, total uint64
}

// sample returns the idle fraction since the previous sample (1 on the
// first, when there is nothing to compare).
func (s *cpuSampler) sample() float64 {
	idle, total, err := readCPUStat()
	if err != nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	di, dt := idle-s.idle, total-s.total
	first := s.total == 0
	s.idle, s.total = idle, total
	if first || dt == 0 {
		return 1
	}
	return float64(di) / float64(dt)
}

func readCPUStat() (idle, total uint64, err error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0, fmt.Errorf("empty /proc/stat")
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("unexpected /proc/stat line %q", sc.Text())
	}
	for i, v := range fields[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, err
		}
		// user nice system idle iowait irq softirq steal guest guest_nice:
		// guest time is already counted in user and nice.
		if i >= 8 {
			break
		}
		total += n
		if i == 3 || i == 4 {
			idle += n
		}
	}
	return idle, total, nil
}

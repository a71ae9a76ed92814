// A Go program that collects garbage often, for the tests that measure Go's
// stop-the-world pauses from outside: runtime.ReadMemStats's own count of collections
// and of their pauses is the record to match.
//
// Protocol (as the other targets): prints `ready pid=N`, works SECONDS at SIGUSR1, prints
// one JSON line (collections, the sum of their stop-the-world pauses) and waits for
// another SIGUSR1 to exit. Usage: gc_workload SECONDS
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

var sink [][]byte

func main() {
	seconds, err := strconv.ParseFloat(os.Args[1], 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "usage: gc_workload SECONDS")
		os.Exit(2)
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGUSR1)
	fmt.Printf("ready pid=%d\n", os.Getpid())
	<-signals
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	deadline := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for rounds := 0; time.Now().Before(deadline); rounds++ {
		batch := make([][]byte, 0, 1000)
		for i := 0; i < 1000; i++ {
			batch = append(batch, make([]byte, 1024))
		}
		if rounds%20 == 0 {
			sink = batch
		}
		if rounds%500 == 0 {
			runtime.GC()
		}
	}
	// A collection still running would end after the record: end them all first.
	runtime.GC()
	runtime.ReadMemStats(&after)
	// PauseNs is a ring of the last 256 pauses, NumGC-1 the latest.
	var pauses uint64
	for n := before.NumGC; n < after.NumGC; n++ {
		pauses += after.PauseNs[n%256]
	}
	line, _ := json.Marshal(map[string]uint64{
		"collections": uint64(after.NumGC - before.NumGC),
		"pause_ns":    pauses,
		"pause_total_ns": after.PauseTotalNs - before.PauseTotalNs,
	})
	fmt.Println(string(line))
	<-signals
}

package main

import (
	"fmt"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/client"
)

func newStatsCmd() *cobra.Command {
	var (
		asJSON  bool
		history time.Duration
	)
	cmd := &cobra.Command{
		Use:   "stats [ID...]",
		Short: "Show sandboxes' CPU, memory and disk use (all running ones without IDs)",
		Long: `Show the newest resource sample of each sandbox, like docker stats --no-stream.
CPU is a percentage of the sandbox's CPU quota since the previous sample; memory
used excludes reclaimable file cache; disk is the writable layer.
With --history and one ID, every sample of that period is shown, oldest first.`,
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if history > 0 {
				if len(ids) != 1 {
					return fmt.Errorf("--history shows one sandbox: give exactly one ID")
				}
				ms, err := c.Metrics(ctx, ids[0], time.Now().Add(-history), time.Time{})
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(ms)
				}
				rows := make([]statsRow, len(ms))
				for i, m := range ms {
					rows[i] = statsRow{ids[0], m}
				}
				return printStats(rows)
			}
			if len(ids) == 0 {
				list, err := c.List(ctx)
				if err != nil {
					return err
				}
				for _, d := range list {
					if d.State == "running" {
						ids = append(ids, d.SandboxID)
					}
				}
			}
			latest := map[string]client.Metric{}
			for chunk := range slices.Chunk(ids, 100) { // the API's per-request limit
				got, err := c.LatestMetrics(ctx, chunk)
				if err != nil {
					return err
				}
				for id, m := range got {
					latest[id] = m
				}
			}
			if asJSON {
				return printJSON(latest)
			}
			var rows []statsRow
			var missing []string
			for _, id := range ids {
				if m, ok := latest[id]; ok {
					rows = append(rows, statsRow{id, m})
				} else {
					missing = append(missing, id)
				}
			}
			if err := printStats(rows); err != nil {
				return err
			}
			if len(missing) > 0 {
				return fmt.Errorf("no metrics for %v: not found, or not running and never sampled", missing)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (E2B SandboxMetric objects)")
	cmd.Flags().DurationVar(&history, "history", 0, "show every sample of this period (e.g. 10m) for one sandbox")
	return cmd
}

type statsRow struct {
	id string
	m  client.Metric
}

func printStats(rows []statsRow) error {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTIME\tCPU %\tCPUS\tMEM USED / LIMIT\tMEM %\tCACHE\tDISK USED / SIZE")
	for _, r := range rows {
		id, m := r.id, r.m
		memPct := 0.0
		if m.MemTotal > 0 {
			memPct = 100 * float64(m.MemUsed) / float64(m.MemTotal)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t%d\t%s / %s\t%.1f%%\t%s\t%s / %s\n", id, m.Timestamp.Local().Format(time.TimeOnly),
			m.CPUUsedPct, m.CPUCount, mib(m.MemUsed), mib(m.MemTotal), memPct, mib(m.MemCache), mib(m.DiskUsed), mib(m.DiskTotal))
	}
	return tw.Flush()
}

func mib(n int64) string { return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)) }

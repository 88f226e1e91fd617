// Package drain empties a node of a cella cluster for maintenance (`cella
// node drain`): the node's Lease is marked so no gateway places anything
// there, then every running sandbox of the node is paused through the
// node's own API (as the cluster's admin), pass after pass until none is
// left running — a create that was in flight when the mark was set is
// caught by the next pass.
//
// Pausing is one function, PauseSandbox: where the cluster has an archive
// store, that step is what archives the paused sandbox so it can resume on
// another node; without one, a paused sandbox resumes on its own node.
package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/errdefs"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
)

// Config is one drain.
type Config struct {
	Kube      ctrlclient.Client
	Namespace string
	Node      string
	Log       *slog.Logger
}

// Result is what became of one sandbox.
type Result struct {
	ID  string
	Err error
}

// maxPasses bounds the passes over a node whose sandboxes keep coming
// (each pass pauses what the one before found running).
const maxPasses = 5

// Drain marks cfg.Node drained and pauses its running sandboxes. It
// returns one Result per sandbox it tried; an error that is not one
// sandbox's (the node is not live, the API server refused) ends it.
func Drain(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if err := cluster.SetDrain(ctx, cfg.Kube, cfg.Namespace, cfg.Node, true); err != nil {
		return nil, err
	}
	node, err := find(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if !node.Live {
		return nil, errdefs.FailedPrecondition("node %s is drained, but its lease lapsed at %s: it cannot pause anything (its sandboxes are reported lost)",
			node.Name, node.RenewedAt.Add(node.Duration).UTC().Format(time.RFC3339))
	}
	key, err := cluster.ReadAdminKey(ctx, cfg.Kube, cfg.Namespace)
	if err != nil {
		return nil, err
	}
	c, err := client.New(client.Config{URL: node.Endpoint, APIKey: key})
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node.Name, err)
	}
	var results []Result
	failed := map[string]bool{}
	for pass := 0; pass < maxPasses; pass++ {
		running, err := c.ListStates(ctx, "running")
		if err != nil {
			return results, fmt.Errorf("list the running sandboxes of node %s: %w", node.Name, err)
		}
		todo := 0
		for _, sb := range running {
			if failed[sb.SandboxID] {
				continue
			}
			todo++
			err := PauseSandbox(ctx, c, node, sb.SandboxID)
			if err != nil {
				failed[sb.SandboxID] = true
				cfg.Log.Warn("drain: pause failed", "node", node.Name, "sandbox", sb.SandboxID, "err", err)
			}
			results = append(results, Result{ID: sb.SandboxID, Err: err})
		}
		if todo == 0 {
			return results, nil
		}
	}
	return results, errdefs.Unavailable("node %s: sandboxes were still being made after %d passes (is a create bypassing the gateway?)", node.Name, maxPasses)
}

// PauseSandbox is drain's step for one sandbox: pause it with its memory
// (a checkpoint), so it resumes where it was. A sandbox that stopped or
// was paused meanwhile (404, 409) is not an error.
func PauseSandbox(ctx context.Context, c *client.Client, node cluster.NodeInfo, id string) error {
	err := c.Pause(ctx, id, true)
	var ae *client.APIError
	if errors.As(err, &ae) && (ae.Status == http.StatusNotFound || ae.Status == http.StatusConflict) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pause %s on node %s: %w", id, node.Name, err)
	}
	return nil
}

// Undrain clears node's mark: gateways place sandboxes there again.
func Undrain(ctx context.Context, kube ctrlclient.Client, ns, node string) error {
	return cluster.SetDrain(ctx, kube, ns, node, false)
}

func find(ctx context.Context, cfg Config) (cluster.NodeInfo, error) {
	nodes, err := cluster.Nodes(ctx, cfg.Kube, cfg.Namespace)
	if err != nil {
		return cluster.NodeInfo{}, err
	}
	for _, n := range nodes {
		if n.Name == cfg.Node {
			return n, nil
		}
	}
	return cluster.NodeInfo{}, errdefs.NotFound("node %s is not in the cluster", cfg.Node)
}

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/cluster"
	"github.com/cella-sandbox/cella/internal/cluster/v1alpha1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
)

// The resume figures of `cella bench cluster`: a sandbox paused into the
// cluster's archive and resumed on its own node, beside the same sandbox
// paused again and resumed through the gateway on another node (its node
// marked drained, as `cella node drain` marks it, so the gateway sends
// the connect elsewhere). A node with an archive drops its local copy at
// the pause, so both pull the archive: the ratio is what the move adds
// (the gateway's choice of another node, the import there: the checks that
// it restores identically, the claim of the record).
const (
	resumeLocalName = "resume from the archive → first exec done, on its own node"
	resumeMovedName = "resume from the archive → first exec done, on another node"
)

// errNoArchive: the nodes pause without archiving, so nothing can move.
var errNoArchive = errors.New("the paused sandbox is not in an archive: cross-node resume needs nodes started with --archive s3://…")

// resumer runs the resume rounds through one gateway.
type resumer struct {
	gw      *client.Client
	kube    ctrlclient.Client
	ns      string
	records *cluster.Records
}

// clusterResume measures n rounds, each a local then a cross-node resume
// of one fresh sandbox. Both figures carry an Err when the cluster cannot
// give them (no API access, fewer than two nodes that take sandboxes, no
// archive): never a number that is not what it says.
func clusterResume(ctx context.Context, cc ClusterConfig, gw *client.Client) (local, moved Figure) {
	var ls, ms []time.Duration
	var lastLocal, lastMoved error
	failedLocal, failedMoved := 0, 0
	if err := resumePrecondition(ctx, cc); err != nil {
		lastLocal, lastMoved = err, err
	} else {
		r := &resumer{gw: gw, kube: cc.Kube, ns: cc.Namespace, records: cluster.NewRecords(cc.Kube, cc.Namespace)}
		for i := 0; i < cc.N; i++ {
			l, m, errL, errM := r.round(ctx)
			if errL == nil {
				ls = append(ls, l)
			} else {
				lastLocal, failedLocal = errL, failedLocal+1
			}
			if errM == nil {
				ms = append(ms, m)
			} else {
				lastMoved, failedMoved = errM, failedMoved+1
			}
			if errors.Is(errL, errNoArchive) || ctx.Err() != nil {
				lastMoved = errL // nothing else can be measured either
				break
			}
		}
	}
	local, moved = summarize(resumeLocalName, "", ls), summarize(resumeMovedName, "", ms)
	moved.against(local)
	// A round that failed is said even when others measured: a figure of
	// fewer rounds than asked is not the figure asked for.
	if lastLocal != nil {
		local.Err = roundsFailed(failedLocal, local.N, lastLocal)
	}
	if lastMoved != nil {
		moved.Err = roundsFailed(failedMoved, moved.N, lastMoved)
	}
	return local, moved
}

// roundsFailed is a figure's error: err alone when no round measured,
// else how many of the rounds failed and the last one's error.
func roundsFailed(failed, measured int, err error) string {
	if measured == 0 {
		return err.Error()
	}
	return fmt.Sprintf("%d of %d rounds failed, the last: %v", failed, failed+measured, err)
}

// resumePrecondition says what the cluster lacks for the resume figures.
func resumePrecondition(ctx context.Context, cc ClusterConfig) error {
	if cc.Kube == nil {
		why := cc.KubeErr
		if why == "" {
			why = "no access"
		}
		return fmt.Errorf("cross-node resume needs the cluster's API (--cluster KUBECONFIG) to see nodes and records: %s", why)
	}
	nodes, err := cluster.Nodes(ctx, cc.Kube, cc.Namespace)
	if err != nil {
		return fmt.Errorf("cross-node resume: list the nodes: %w", err)
	}
	placing := 0
	for _, n := range nodes {
		if n.Live && !n.Drained() && n.Endpoint != "" {
			placing++
		}
	}
	if placing < 2 {
		return fmt.Errorf("cross-node resume needs a cluster of at least 2 live, undrained nodes with an archive (--archive s3://…); namespace %s has %d of %d", cc.Namespace, placing, len(nodes))
	}
	return nil
}

// round creates a sandbox through the gateway, pauses it and times its
// resume on its own node, then pauses it again, marks its node drained and
// times its resume on the node the gateway picks; the mark is removed and
// the sandbox killed before it returns.
func (r *resumer) round(ctx context.Context) (local, moved time.Duration, errLocal, errMoved error) {
	created, err := r.gw.Create(ctx, client.CreateRequest{Timeout: new(int64(600))})
	if err != nil {
		return 0, 0, err, err
	}
	id := created.SandboxID
	defer r.kill(context.WithoutCancel(ctx), id)
	if _, err := r.resume(ctx, id, false); err != nil { // running and answering before the first pause
		return 0, 0, err, err
	}
	if _, err := r.wait(ctx, id, v1alpha1.SandboxRunning); err != nil {
		return 0, 0, err, err
	}
	from, err := r.pause(ctx, id)
	if err != nil {
		return 0, 0, err, err
	}
	if local, err = r.resume(ctx, id, true); err != nil {
		return 0, 0, fmt.Errorf("resume on its own node: %w", err), err
	}
	// Paused again only once its node recorded it running, so the
	// gateway reads the second pause's record, not the first one's.
	if rec, err := r.wait(ctx, id, v1alpha1.SandboxRunning); err != nil || rec.Spec.Node != from {
		err = fmt.Errorf("resumed on its own node %s, its record says %s (%v)", from, where(rec), err)
		return 0, 0, err, err
	}
	if from, err = r.pause(ctx, id); err != nil {
		return local, 0, nil, err
	}
	// Unmarked whatever happens, even when the mark's own update failed
	// (an interrupt may end the call after the API server applied it).
	if errMoved = cluster.SetDrain(ctx, r.kube, r.ns, from, true); errMoved != nil {
		errMoved = fmt.Errorf("mark node %s drained: %w", from, errMoved)
	} else {
		moved, errMoved = r.resume(ctx, id, true)
	}
	if err := cluster.SetDrain(context.WithoutCancel(ctx), r.kube, r.ns, from, false); err != nil && errMoved == nil {
		errMoved = fmt.Errorf("undrain node %s: %w", from, err)
	}
	if errMoved != nil {
		return local, 0, nil, errMoved
	}
	if rec, err := r.records.Sandbox(ctx, id); err != nil || rec.Spec.Node == from {
		return local, 0, nil, fmt.Errorf("resumed with node %s drained, but not on another node: its record says %s (%v)", from, where(rec), err)
	}
	return local, moved, nil, nil
}

// pause pauses sandbox id through the gateway and waits for its record to
// say paused; it returns the record's node, and errNoArchive when the
// pause left the sandbox on its node only.
func (r *resumer) pause(ctx context.Context, id string) (string, error) {
	if err := r.gw.Pause(ctx, id, true); err != nil {
		return "", fmt.Errorf("pause: %w", err)
	}
	// The node says whether the pause archived (its detail's lifecycle);
	// its record may say paused a pass before it says archived.
	d, err := r.gw.Get(ctx, id)
	if err != nil {
		return "", fmt.Errorf("read the paused sandbox: %w", err)
	}
	var detail struct {
		Lifecycle struct {
			Archived bool `json:"archived"`
		} `json:"lifecycle"`
	}
	if err := json.Unmarshal(d.Raw, &detail); err != nil {
		return "", fmt.Errorf("read the paused sandbox: %w", err)
	}
	if !detail.Lifecycle.Archived {
		return "", errNoArchive
	}
	rec, err := r.waitFor(ctx, id, v1alpha1.SandboxPaused, true)
	if err != nil {
		return "", err
	}
	return rec.Spec.Node, nil
}

// wait waits for the record of sandbox id to be in phase: its node writes
// its records at its own pace, so this is bounded, not timed.
func (r *resumer) wait(ctx context.Context, id string, phase v1alpha1.SandboxPhase) (*v1alpha1.Sandbox, error) {
	return r.waitFor(ctx, id, phase, false)
}

// waitFor is wait, for a record that also says archived when archived.
func (r *resumer) waitFor(ctx context.Context, id string, phase v1alpha1.SandboxPhase, archived bool) (*v1alpha1.Sandbox, error) {
	wait, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		rec, err := r.records.Sandbox(wait, id)
		if err == nil && rec.Status.Phase == phase && (!archived || rec.Status.Archived) {
			return rec, nil
		}
		select {
		case <-wait.Done():
			return nil, fmt.Errorf("the record of sandbox %s never said %s: %s (%v)", id, phase, where(rec), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// resume times a connect through the gateway (a resume when resumed) to
// the first exec answered in the sandbox.
func (r *resumer) resume(ctx context.Context, id string, resumed bool) (time.Duration, error) {
	start := time.Now()
	_, was, err := r.gw.ConnectResumed(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	if was != resumed {
		return 0, fmt.Errorf("connect of sandbox %s: resumed=%v, want %v", id, was, resumed)
	}
	conn, err := r.gw.Sandbox(ctx, id)
	if err != nil {
		return 0, err
	}
	if err := sdkExec(ctx, conn); err != nil {
		return 0, fmt.Errorf("first exec: %w", err)
	}
	return time.Since(start), nil
}

// where is a record's node and phase, for an error.
func where(rec *v1alpha1.Sandbox) string {
	if rec == nil {
		return "none"
	}
	return fmt.Sprintf("node %s, %s, archived %v", rec.Spec.Node, rec.Status.Phase, rec.Status.Archived)
}

// kill kills sandbox id, again for a while when it fails: a round ended by
// an interrupt may leave a resume in flight on some node, which the kill
// has to outwait.
func (r *resumer) kill(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		err := r.gw.Kill(ctx, id)
		if err == nil || client.IsNotFound(err) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

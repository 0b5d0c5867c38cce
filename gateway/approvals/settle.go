package approvals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/slack"
)

// settleQuestion settles the messages that asked question id (RUN/STEP),
// once it no longer stands: each is updated without its answer buttons,
// saying what became of the question. A message its provider cannot
// update for good (deleted, say) is given up on; any other failure is
// returned, for the loop to try again.
func (gw *Approvals) settleQuestion(ctx context.Context, id string) error {
	list, _, err := gw.Questions.Read(ctx, id)
	if err != nil || len(list) == 0 {
		return err
	}
	said, stands, err := gw.questionOutcome(ctx, id)
	if err != nil || stands {
		return err
	}
	var failed error
	var settled []gateway.QuestionMessage
	for _, m := range list {
		err := gw.settleMessage(ctx, id, m, said)
		var pe *providers.Error
		if err != nil && (!errors.As(err, &pe) || providers.IsRetryable(err)) {
			failed = errors.Join(failed, err)
			continue
		}
		if err != nil {
			gw.Log.Warn("a Slack message that asked an approval step's question cannot be settled; it is left as it is", "question", id, "channel", m.Channel, "ts", m.TS, "err", err)
		} else {
			gw.Log.Info("settled a Slack message of an approval step's question", "question", id, "channel", m.Channel, "ts", m.TS, "said", said)
		}
		settled = append(settled, m)
	}
	changed, err := gw.Questions.Forget(ctx, id, list, settled)
	switch {
	case failed != nil || err != nil:
		return errors.Join(failed, err)
	case changed:
		return gateway.ErrQuestionChanged
	}
	return nil
}

// settleMessage updates m, a message that asked question id, to say what
// became of it.
func (gw *Approvals) settleMessage(ctx context.Context, id string, m gateway.QuestionMessage, said string) error {
	p := gw.Engine.Config().Providers[m.Provider]
	if p == nil {
		return providers.Permanent("no_provider", "no provider %q in the config to update the message through", m.Provider)
	}
	update := map[string]any{"channel": m.Channel, "ts": m.TS, "blocks": settledBlocks(m.Blocks, id, said)}
	if m.Text != "" {
		update["text"] = m.Text
	}
	payload, err := jsonx.Marshal(update)
	if err != nil {
		return fmt.Errorf("encoding the update of a Slack message: %w", err)
	}
	runID, step := gateway.SplitQuestion(id)
	return gw.callProvider(ctx, p, providers.Request{ActionType: slack.UpdateMessage, Payload: payload,
		DedupKey: "slack-settle/" + id + "/" + m.Channel + "/" + m.TS, Attempt: 1, RunID: runID, Step: step})
}

// questionOutcome says what became of question id (RUN/STEP), or that it
// still stands: its run goes on and the step has not ended, whether it
// waits or is still to come.
func (gw *Approvals) questionOutcome(ctx context.Context, id string) (said string, stands bool, err error) {
	runID, step := gateway.SplitQuestion(id)
	run, err := gw.Store.RunHeader(ctx, runID)
	if errors.Is(err, store.ErrNotFound) {
		return ":no_entry_sign: No longer asked: the run is no longer kept", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("reading the run of question %s: %w", id, err)
	}
	var rec *store.StepRecord
	err = gw.Store.ForEachStep(ctx, runID, store.StepScan{Prefix: step, Exact: true}, func(r *store.StepRecord) error {
		rec = r
		return nil
	})
	if err != nil {
		return "", false, fmt.Errorf("reading the step of question %s: %w", id, err)
	}
	stepEnded := rec != nil && rec.Status.Final()
	if !run.Status.Final() && !stepEnded {
		return "", true, nil
	}
	var d engine.Decision
	switch {
	case stepEnded && json.Unmarshal(rec.Body, &d) == nil && (d.Decision == chain.DecisionApprove || d.Decision == chain.DecisionReject):
		return decisionLine(&d), false, nil
	case stepEnded && rec.Status == store.StepTimedOut && run.Status != store.RunTimedOut:
		// The step's own deadline; the run's is said below.
		return fmt.Sprintf(":hourglass: No answer before the step's deadline, %s: it timed out", rec.FinishedAt.UTC().Format(slackStamp)), false, nil
	case run.Status.Final():
		why := "the run ended " + string(run.Status)
		if run.Error != nil && run.Error.Message != "" {
			why = run.Error.Message
		}
		return fmt.Sprintf(":no_entry_sign: No longer asked: %s at %s", why, run.FinishedAt.UTC().Format(slackStamp)), false, nil
	}
	return fmt.Sprintf(":no_entry_sign: No longer asked: the step ended %s", rec.Status), false, nil
}

package lifecyclemsg_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/retryd/retryd/internal/lifecyclemsg"
	"github.com/retryd/retryd/pkg/contract"
)

// fakeMsg is a message as a consumer hands it over, from a *nats.Msg.
type fakeMsg struct {
	jetstream.Msg
	m *nats.Msg
}

func (f fakeMsg) Subject() string      { return f.m.Subject }
func (f fakeMsg) Data() []byte         { return f.m.Data }
func (f fakeMsg) Headers() nats.Header { return f.m.Header }

func dueMsg(t *testing.T, kind string) fakeMsg {
	t.Helper()
	m, err := contract.NewLifecycleMsg("test", contract.Due, contract.DueData{Kind: kind, ID: "i1", Attempt: 2}, time.Now())
	require.NoError(t, err)
	return fakeMsg{m: m}
}

// Decode passes a lifecycle event of the owner's kind (and of the events
// asked for) and refuses any other as invalid, naming the subject.
func TestDecode(t *testing.T) {
	t.Parallel()
	msg := dueMsg(t, contract.KindEventTrigger)
	ev, err := lifecyclemsg.Decode(msg, contract.KindEventTrigger)
	require.NoError(t, err)
	require.Equal(t, "i1", ev.ID)
	require.NotNil(t, ev.Due)
	_, err = lifecyclemsg.Decode(msg, contract.KindEventTrigger, contract.Scheduled, contract.Due)
	require.NoError(t, err)

	_, err = lifecyclemsg.Decode(msg, contract.KindEvent)
	require.ErrorIs(t, err, contract.ErrInvalid)
	require.ErrorContains(t, err, msg.Subject()+`" is not a lifecycle event of kind event`)
	_, err = lifecyclemsg.Decode(msg, contract.KindEventTrigger, contract.Scheduled)
	require.ErrorIs(t, err, contract.ErrInvalid)
	require.ErrorContains(t, err, "is not a lifecycle event [scheduled] of kind event-trigger")

	_, err = lifecyclemsg.Decode(fakeMsg{m: &nats.Msg{Subject: msg.Subject(), Data: []byte("{")}}, contract.KindEventTrigger)
	require.Error(t, err)
}

// InboxID is the message's Nats-Msg-Id, or its envelope's id without one.
func TestInboxID(t *testing.T) {
	t.Parallel()
	msg := dueMsg(t, contract.KindRun)
	ev, err := lifecyclemsg.Decode(msg, contract.KindRun)
	require.NoError(t, err)
	msg.m.Header.Set(contract.HeaderMsgID, "published-as")
	require.Equal(t, "published-as", lifecyclemsg.InboxID(msg, ev.Envelope))

	msg.m.Header = nil
	require.Equal(t, ev.Envelope.ID, lifecyclemsg.InboxID(msg, ev.Envelope))
}

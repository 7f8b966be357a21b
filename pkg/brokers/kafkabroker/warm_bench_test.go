package kafkabroker

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/sinks"
)

// BenchmarkFirstPublish times the first publish of a new sink, which must
// be as fast as the rest: cold (NewSink alone), warm (NewSink and Warm, as SinkConfig.Open does), and
// a later publish of a warm sink. Only the publish is timed.
//
//	go test -run '^$' -bench FirstPublish -benchtime 50x ./pkg/brokers/kafkabroker/
func BenchmarkFirstPublish(b *testing.B) {
	k := testenv.Kafka(b, testenv.WithTopic("out", 3))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	open := func(b *testing.B, warm bool) *Sink {
		s, err := NewSink(withSinkDefaults(SinkParams{Name: "bench", Brokers: k.Brokers}), log)
		if err != nil {
			b.Fatal(err)
		}
		if warm {
			s.Warm(context.Background())
		}
		return s
	}
	publish := func(b *testing.B, s *Sink, i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if errs := s.Publish(ctx, []sinks.Outgoing{out("m"+strconv.Itoa(i), "out", nil, []byte("x"))}); errs[0] != nil {
			b.Fatal(errs[0])
		}
	}
	for _, warm := range []bool{false, true} {
		name := "cold"
		if warm {
			name = "warm"
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				s := open(b, warm)
				b.StartTimer()
				publish(b, s, i)
				b.StopTimer()
				_ = s.Close()
				b.StartTimer()
			}
		})
	}
	b.Run("later", func(b *testing.B) {
		s := open(b, true)
		defer s.Close()
		publish(b, s, -1)
		for i := 0; b.Loop(); i++ {
			publish(b, s, i)
		}
	})
}

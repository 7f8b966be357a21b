package ops

import (
	"context"
	"errors"
	"slices"

	"github.com/delaybridge/delaybridge/pkg/store"
)

// ListDead returns the newest dead messages the query selects, newest
// first.
func (s *Service) ListDead(ctx context.Context, q DeadQuery) ([]DeadView, error) {
	limit := DefaultDeadLimit
	if q.Limit != nil {
		if limit = *q.Limit; limit < 1 || limit > MaxDeadLimit {
			return nil, invalid("limit", "limit %d: give an integer from 1 to %d", limit, MaxDeadLimit)
		}
	}
	var infos []*store.Info
	if !q.any() {
		var err error
		if infos, err = s.p.Store.ListDead(ctx, limit); err != nil {
			return nil, err
		}
	} else {
		// The listing of dead messages runs by time of death, oldest
		// first: read every match, keep the newest.
		err := s.eachDead(ctx, q.DeadFilter, func(page []*store.Info) error {
			infos = append(infos, page...)
			return nil
		})
		if err != nil {
			return nil, err
		}
		slices.Reverse(infos)
		if len(infos) > limit {
			infos = infos[:limit]
		}
	}
	out := make([]DeadView, 0, len(infos))
	for _, info := range infos {
		out = append(out, NewDeadView(info))
	}
	return out, nil
}

// eachDead calls f with each page of the dead messages f selects, oldest
// first.
func (s *Service) eachDead(ctx context.Context, f DeadFilter, each func(page []*store.Info) error) error {
	bq, verr := f.browse()
	if verr != nil {
		return verr
	}
	for {
		p, err := s.p.Store.Browse(ctx, bq)
		if err != nil {
			return err
		}
		if err := each(p.Messages); err != nil {
			return err
		}
		if p.Next == "" {
			return nil
		}
		bq.Cursor = p.Next
	}
}

// DeleteDead deletes a dead message; a message that is not dead is left
// alone.
func (s *Service) DeleteDead(ctx context.Context, id string) error {
	if err := checkID("id", "the message ID", id); err != nil {
		return err
	}
	err := s.p.Store.DeleteDead(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return noDeadMessage(id)
	}
	return err
}

// PurgeDead deletes every dead message the filter selects.
func (s *Service) PurgeDead(ctx context.Context, f DeadFilter) (*PurgedView, error) {
	if !f.any() {
		n, err := s.p.Store.PurgeDead(ctx)
		if err != nil {
			return nil, err
		}
		return &PurgedView{Deleted: n}, nil
	}
	deleted := 0
	err := s.eachDead(ctx, f, func(page []*store.Info) error {
		for _, info := range page {
			err := s.p.Store.DeleteDead(ctx, info.ID)
			switch {
			case errors.Is(err, store.ErrNotFound): // retried or deleted meanwhile
			case err != nil:
				return err
			default:
				deleted++
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &PurgedView{Deleted: deleted}, nil
}

// RetryDead schedules a dead message again, due now.
func (s *Service) RetryDead(ctx context.Context, id string, req RetryRequest) error {
	if err := checkID("id", "the message ID", id); err != nil {
		return err
	}
	err := s.p.Store.RetryDead(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return noDeadMessage(id)
	}
	if err != nil {
		return err
	}
	s.notify(id, s.p.Now())
	return nil
}

"""A Celery app as its users write one, for celery_test.go.

Its task records each run in a file. The test publishes it the way a
Celery user would with RabbitMQ's delayed-message exchange: apply_async
to the queue delaybridge reads, with an x-delay header in milliseconds.
delaybridge publishes it, when due, to the queue a real worker of this
app consumes (celery -A delayapp worker).

    python3 delayapp.py publish WHO DELAY_MS [WHO DELAY_MS...]

publishes one task per pair and prints their IDs, one per line.
Environment: DELAYAPP_BROKER (the AMQP URL), DELAYAPP_WORKER_QUEUE (the
worker's queue), DELAYAPP_INGEST_QUEUE (delaybridge's), DELAYAPP_OUT (the
file each run appends a JSON line to).
"""
import json
import os
import sys
import time

from celery import Celery

app = Celery('delayapp', broker=os.environ['DELAYAPP_BROKER'])
app.conf.update(
    task_default_queue=os.environ['DELAYAPP_WORKER_QUEUE'],
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    task_acks_late=True,
)


@app.task(bind=True, name='delayapp.remind')
def remind(self, who, sent_at):
    run = {
        'id': self.request.id,
        'who': who,
        'sent_at': sent_at,
        'ran_at': time.time(),
        'retries': self.request.retries,
        'eta': self.request.eta,
        'correlation_id': self.request.correlation_id,
        # the message's AMQP headers that are not Celery's own
        'headers': {k: v for k, v in self.request.properties.get('application_headers', {}).items()
                    if k.startswith('x-')},
    }
    with open(os.environ['DELAYAPP_OUT'], 'a') as f:
        f.write(json.dumps(run, default=str) + '\n')


if __name__ == '__main__' and sys.argv[1:2] == ['publish']:
    pairs = sys.argv[2:]
    for who, delay in zip(pairs[0::2], pairs[1::2]):
        r = remind.apply_async(args=[who, time.time()], queue=os.environ['DELAYAPP_INGEST_QUEUE'],
                               headers={'x-delay': int(delay)})
        print(r.id, flush=True)

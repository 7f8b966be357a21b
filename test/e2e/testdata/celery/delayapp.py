"""A Celery app as its users write one, for celery_test.go.

Its task records each run in a file. The test publishes it the way a
Celery user would with RabbitMQ's delayed-message exchange: apply_async
to the queue delaybridge reads, with an x-delay header in milliseconds.
delaybridge publishes it, when due, to the queue a real worker of this
app consumes (celery -A delayapp worker).

    python3 delayapp.py publish WHO DELAY_MS[:id] [WHO DELAY_MS[:id]...]

publishes one task per pair and prints their IDs, one per line. With
":id", the task's ID is its delaybridge message ID too (x-message-id), so
that it can be cancelled by it: DELETE /v1/messages/<task ID>.
Environment: DELAYAPP_BROKER (the AMQP URL), DELAYAPP_WORKER_QUEUE (the
worker's queue), DELAYAPP_INGEST_QUEUE (delaybridge's), DELAYAPP_OUT (the
file each run appends a JSON line to).
"""
import json
import os
import sys
import time
import uuid

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
        delay, _, by_id = delay.partition(':')
        task_id = str(uuid.uuid4())
        headers = {'x-delay': int(delay)}
        if by_id == 'id':
            headers['x-message-id'] = task_id
        r = remind.apply_async(args=[who, time.time()], task_id=task_id,
                               queue=os.environ['DELAYAPP_INGEST_QUEUE'], headers=headers)
        print(r.id, flush=True)
